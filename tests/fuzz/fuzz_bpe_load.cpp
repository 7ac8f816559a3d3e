// Fuzzes data::BpeTokenizer::load (memtrain's JSON format); a tokenizer that loads must round-trip text.
#include "bpe_round_trip.h"
#include "fuzz_file.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const memtrain::fuzz::FuzzFile file("tokenizer.json", data, size);
  try {
    memtrain::fuzz::check_round_trip(memtrain::data::BpeTokenizer::load(file.path()));
  } catch (const std::exception&) {
  }
  return 0;
}
