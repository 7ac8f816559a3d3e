// Fuzzes train::TrainerConfig::load: any input must load or throw. A config that loads is also validated
// and written back to JSON, the two things every caller does next.
#include "fuzz_file.h"
#include "memtrain/train/trainer_config.h"

#include <nlohmann/json.hpp>

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const memtrain::fuzz::FuzzFile file("config.json", data, size);
  try {
    const auto config = memtrain::train::TrainerConfig::load(file.path());
    (void)config.to_json().dump();
    config.validate();
  } catch (const std::exception&) {
  }
  return 0;
}
