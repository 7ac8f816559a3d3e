// Fuzzes io::load_safetensors_metadata and io::load_safetensors: any input must load or throw.
#include "fuzz_file.h"
#include "memtrain/io/safetensors.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const memtrain::fuzz::FuzzFile file("model.safetensors", data, size);
  try {
    (void)memtrain::io::load_safetensors_metadata(file.path());
  } catch (const std::exception&) {
  }
  try {
    // Reading every byte of every tensor lets ASan check that each one was fully allocated.
    unsigned sum = 0;
    for (const auto& [name, t] : memtrain::io::load_safetensors(file.path())) {
      const auto* p = static_cast<const unsigned char*>(t.data_ptr());
      for (std::size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
    }
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const std::exception&) {
  }
  return 0;
}
