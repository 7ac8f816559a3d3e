// Fuzzes data::TokenShard (llm.c token shards, memory-mapped): a shard that opens must let every one of
// its tokens be read and checked against a vocabulary.
#include "fuzz_file.h"
#include "memtrain/data/token_shard.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const memtrain::fuzz::FuzzFile file("shard.bin", data, size);
  try {
    const memtrain::data::TokenShard shard(file.path());
    unsigned sum = 0;
    for (std::size_t i = 0; i < shard.size(); ++i) sum += shard[i];
    volatile unsigned sink = sum;
    (void)sink;
    shard.check_vocab(50257);
  } catch (const std::exception&) {
  }
  return 0;
}
