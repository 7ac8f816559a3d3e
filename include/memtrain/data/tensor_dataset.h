// TensorDataset: a Dataset over tensors already in memory (a regression table, features computed earlier),
// so a program with its data in two tensors needs no collate of its own.
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/data/loader.h"

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::data {

// Sample i is row i of inputs [N, ...] and of targets [N, ...] (same N; any dtypes; either may be [N]).
// collate gives inputs [B, ...] and targets [B, ...] in those dtypes on the CPU, allocated under
// MemoryCategory::data; targets_count is every element of the batch's targets (B times a target row).
// Tensors on another device are copied to the CPU once, at construction; CPU tensors are kept as they are
// when contiguous (no copy; writing into them later changes the samples).
class TensorDataset : public Dataset {
 public:
  TensorDataset(const Tensor& inputs, const Tensor& targets);
  std::int64_t size() const override { return inputs_.size(0); }
  Batch collate(const std::vector<std::int64_t>& indices) const override;
  std::string describe() const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_;   // (N, ...), CPU, contiguous, no autograd history
  Tensor targets_;  // (N, ...)
};

}  // namespace memtrain::data
