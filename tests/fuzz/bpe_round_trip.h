// The check both tokenizer harnesses run on a tokenizer that loaded: encode a fixed text through the
// loaded tables and decode it back. bpe_tokenizer.h promises decode(encode(s)) == s for any bytes.
#pragma once

#include "memtrain/data/bpe_tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace memtrain::fuzz {

inline void check_round_trip(const data::BpeTokenizer& tok) {
  // Letters, digits, contractions, runs of spaces, the special token, UTF-8 and invalid bytes.
  constexpr std::string_view kText =
      "Hello world, it's 2024!  caf\xc3\xa9 \xe2\x82\xac <|endoftext|>\xff\xfe ab\n\n  aaaa 123";
  const auto ids = tok.encode(kText);
  if (tok.decode(ids) != kText) {
    std::fprintf(stderr, "decode(encode(s)) != s for a tokenizer that loaded\n");
    std::abort();
  }
}

}  // namespace memtrain::fuzz
