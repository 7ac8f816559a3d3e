// What the Trainer tests share: a deterministic regression dataset, the loss of a GPT on its batch, and the
// quiet part of a fast test config (no files, no periodic eval, no clipping, constant lr).
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/data/loader.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/trainer.h"
#include "memtrain/train/trainer_config.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memtrain::test_support {

// Regression samples x [D] -> y [O], deterministic; targets_count = B * O (the loss is a mean over those).
class RegressionDataset : public data::Dataset {
 public:
  RegressionDataset(std::int64_t n, std::int64_t d, std::int64_t o) : n_(n), d_(d), o_(o) {}
  std::int64_t size() const override { return n_; }
  data::Batch collate(const std::vector<std::int64_t>& idx) const override {
    const auto b = static_cast<std::int64_t>(idx.size());
    std::vector<float> x, y;
    for (std::int64_t i : idx) {
      for (std::int64_t k = 0; k < d_; ++k) x.push_back(static_cast<float>(std::sin(0.7 * i + 1.3 * k)));
      for (std::int64_t k = 0; k < o_; ++k) y.push_back(static_cast<float>(std::cos(0.3 * i * (k + 1) + k)));
    }
    CategoryGuard category(MemoryCategory::data);
    data::Batch batch;
    batch.inputs = tensor(x, {b, d_});
    batch.targets = tensor(y, {b, o_});
    batch.samples = b;
    batch.targets_count = b * o_;
    return batch;
  }
  std::string describe() const override { return "regression"; }

 private:
  std::int64_t n_, d_, o_;
};

inline train::LossFn gpt_loss(const std::shared_ptr<nn::GPT>& gpt) {
  return [gpt](const data::Batch& b) { return gpt->loss(b.inputs, b.targets); };
}

// One prefetched batch, in order, constant lr, no clipping, no periodic eval, no progress lines, no files;
// micro-batch 2 for 4 steps. Tests set the rest.
inline train::TrainerConfig quiet_config() {
  train::TrainerConfig c;
  c.data.prefetch = 1;
  c.data.shuffle = false;
  c.schedule.decay = train::LrDecay::constant;
  c.grad_clip = 0.0;
  c.micro_batch = 2;
  c.max_steps = 4;
  c.eval_interval = 0;
  c.log_interval = 1000;
  return c;
}

}  // namespace memtrain::test_support
