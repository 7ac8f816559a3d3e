#include "io/json_file.h"

#include "io/atomic_file.h"
#include "io/json_limits.h"
#include "memtrain/core/error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace memtrain::detail {

nlohmann::json read_json_object_file(const std::string& path, const char* where) {
  std::ifstream in(path);
  MT_CHECK(in.good(), where, "'{}': cannot open: {}", path, std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in, json_depth_limit(where, path));
  } catch (const nlohmann::json::parse_error& e) {
    throw_error(where, fmt::format("'{}': not valid JSON: {}", path, e.what()));
  }
  MT_CHECK(j.is_object(), where, "'{}': a JSON {}, expected an object", path, j.type_name());
  return j;
}

void write_json_file(const std::string& path, const nlohmann::json& j, const char* where) {
  const std::string text = j.dump(2) + "\n";
  AtomicFileWriter out(path, where);
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace memtrain::detail
