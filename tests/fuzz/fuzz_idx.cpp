// Fuzzes data::read_idx on the input's own bytes: plain IDX files, and gzip files (the corpus has both;
// the reader tells them apart by their bytes, not the name).
#include "fuzz_file.h"
#include "memtrain/data/idx.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const memtrain::fuzz::FuzzFile file("images.idx", data, size);
  try {
    (void)memtrain::data::read_idx(file.path());
  } catch (const std::exception&) {
  }
  return 0;
}
