// Whole-file reads for the tokenizer and corpus files.
#include "data/text_file.h"

#include "memtrain/core/error.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace memtrain::data::detail {

std::string read_text_file(const std::string& path, const std::string& where) {
  std::error_code ec;
  MT_CHECK(!std::filesystem::is_directory(path, ec), where, "'{}': is a directory, expected a file", path);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), where, "'{}': cannot open: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  MT_CHECK(!in.bad(), where, "'{}': read failed", path);
  return std::move(text).str();
}

}  // namespace memtrain::data::detail
