// Fuzzes nn::gpt2_config_from_hf_json (Hugging Face GPT-2 config.json): any input must give a config or
// throw.
#include "fuzz_file.h"
#include "memtrain/nn/hf_gpt2.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const memtrain::fuzz::FuzzFile file("config.json", data, size);
  try {
    (void)memtrain::nn::gpt2_config_from_hf_json(file.path());
  } catch (const std::exception&) {
  }
  return 0;
}
