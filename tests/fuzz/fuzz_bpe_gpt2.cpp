// Fuzzes data::BpeTokenizer::from_gpt2_files. The input is split at its first NUL byte: encoder.json
// before it, vocab.bpe after it (no NUL: an empty vocab.bpe). A NUL cannot appear in valid JSON, so the
// split costs encoder.json nothing; vocab.bpe may still contain NULs.
#include "bpe_round_trip.h"
#include "fuzz_file.h"

#include <cstring>
#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* nul = static_cast<const std::uint8_t*>(std::memchr(data, 0, size));
  const std::size_t enc_size = nul ? static_cast<std::size_t>(nul - data) : size;
  const std::size_t bpe_at = nul ? enc_size + 1 : size;
  const memtrain::fuzz::FuzzFile encoder("encoder.json", data, enc_size);
  const memtrain::fuzz::FuzzFile vocab("vocab.bpe", data + bpe_at, size - bpe_at);
  try {
    memtrain::fuzz::check_round_trip(memtrain::data::BpeTokenizer::from_gpt2_files(encoder.path(), vocab.path()));
  } catch (const std::exception&) {
  }
  return 0;
}
