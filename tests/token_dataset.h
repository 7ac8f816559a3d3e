// TokenDataset: token windows over a fixed pseudo-random stream, for Trainer tests that need a language-model
// dataset without files. Sample i = stream[i*T, i*T + T] (T+1 tokens: inputs and the targets shifted by one).
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/data/loader.h"

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::test_support {

class TokenDataset : public data::Dataset {
 public:
  TokenDataset(std::int64_t n, std::int64_t t, std::int64_t vocab) : n_(n), t_(t), vocab_(vocab) {}
  std::int64_t size() const override { return n_; }
  data::Batch collate(const std::vector<std::int64_t>& idx) const override {
    const auto b = static_cast<std::int64_t>(idx.size());
    std::vector<std::int64_t> in, tg;
    for (std::int64_t i : idx) {
      for (std::int64_t k = 0; k < t_; ++k) {
        in.push_back(token(i * t_ + k));
        tg.push_back(token(i * t_ + k + 1));
      }
    }
    CategoryGuard category(MemoryCategory::data);
    data::Batch batch;
    batch.inputs = tensor(in, {b, t_});
    batch.targets = tensor(tg, {b, t_});
    batch.samples = b;
    batch.targets_count = b * t_;
    return batch;
  }
  std::string describe() const override { return "tokens"; }

 private:
  std::int64_t token(std::int64_t j) const { return (j * j * 31 + j * 7 + 3) % vocab_; }
  std::int64_t n_, t_, vocab_;
};

}  // namespace memtrain::test_support
