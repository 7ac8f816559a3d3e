// TokenWindowDataset: fixed-length language-model windows over memory-mapped llm.c token shards.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/data/loader.h"

#include <algorithm>

namespace memtrain::data {

namespace {
constexpr const char* kWhere = "TokenWindowDataset";
}  // namespace

TokenWindowDataset::TokenWindowDataset(const std::vector<std::string>& shard_paths, std::int64_t seq_len,
                                       std::int64_t vocab_size)
    : seq_len_(seq_len), vocab_size_(vocab_size) {
  MT_CHECK(!shard_paths.empty(), kWhere, "no shard paths given");
  MT_CHECK(seq_len >= 1, kWhere, "seq_len {} must be >= 1", seq_len);
  MT_CHECK(vocab_size >= 1, kWhere, "vocab_size {} must be >= 1", vocab_size);
  std::int64_t start = 0;
  for (const auto& path : shard_paths) {
    TokenShard shard(path);
    // Checked once here so that an out-of-range id fails at open, naming the shard, not inside an embedding.
    shard.check_vocab(vocab_size);
    shard_starts_.push_back(start);
    start += static_cast<std::int64_t>(shard.size());
    shards_.push_back(std::move(shard));
  }
  MT_CHECK(start >= seq_len + 1, kWhere,
           "{} shard(s) starting with '{}' hold {} tokens, too few for one window of seq_len + 1 = {} tokens",
           shard_paths.size(), shard_paths.front(), start, seq_len + 1);
}

std::int64_t TokenWindowDataset::total_tokens() const {
  return shard_starts_.back() + static_cast<std::int64_t>(shards_.back().size());
}

std::int64_t TokenWindowDataset::size() const { return (total_tokens() - 1) / seq_len_; }

Batch TokenWindowDataset::collate(const std::vector<std::int64_t>& indices) const {
  MT_CHECK(!indices.empty(), "TokenWindowDataset::collate", "no sample indices");
  const auto b = static_cast<std::int64_t>(indices.size());
  const std::int64_t t = seq_len_;
  Batch batch;
  {
    CategoryGuard guard(MemoryCategory::data);
    batch.inputs = Tensor::empty({b, t}, DType::i64);   // (B,T)
    batch.targets = Tensor::empty({b, t}, DType::i64);  // (B,T)
  }
  auto* inputs = batch.inputs.data<std::int64_t>();
  auto* targets = batch.targets.data<std::int64_t>();
  const std::int64_t n = size();
  for (std::int64_t row = 0; row < b; ++row) {
    const std::int64_t sample = indices[static_cast<std::size_t>(row)];
    MT_CHECK(sample >= 0 && sample < n, "TokenWindowDataset::collate", "sample index {} is outside [0, {})", sample,
             n);
    // Stream positions [sample*T, sample*T + T]; the window may run across shard boundaries.
    std::int64_t pos = sample * t;
    auto it = std::upper_bound(shard_starts_.begin(), shard_starts_.end(), pos);
    auto s = static_cast<std::size_t>(it - shard_starts_.begin() - 1);
    for (std::int64_t k = 0; k <= t; ++k, ++pos) {
      while (pos - shard_starts_[s] >= static_cast<std::int64_t>(shards_[s].size())) ++s;
      const std::int64_t token = shards_[s][static_cast<std::size_t>(pos - shard_starts_[s])];
      if (k < t) inputs[row * t + k] = token;
      if (k > 0) targets[row * t + k - 1] = token;
    }
  }
  batch.samples = b;
  batch.targets_count = b * t;
  return batch;
}

std::string TokenWindowDataset::describe() const {
  return fmt::format("TokenWindowDataset: {} shard(s) from '{}', {} tokens, seq_len {}, vocab {}: {} windows",
                     shards_.size(), shards_.front().path(), total_tokens(), seq_len_, vocab_size_, size());
}

}  // namespace memtrain::data
