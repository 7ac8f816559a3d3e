// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") with its one moment in 8-bit
// block-wise state: update = sign(beta1 m + (1 - beta1) g), p <- p (1 - lr wd) - lr update,
// m <- beta2 m + (1 - beta2) g. State per parameter of n >= min_8bit_size elements: "exp_avg.codes"
// (u8 [n], signed map) and "exp_avg.absmax" (f32 [ceil(n/block)]) = n + 4 ceil(n/block) bytes; smaller
// parameters keep "exp_avg" in f32 (4n bytes). Parameters and gradients are f32.
#pragma once

#include "memtrain/optim/blockwise_optimizer.h"

#include <cstdint>

namespace memtrain::optim {

class Lion8bit : public BlockwiseOptimizer {
 public:
  Lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size = 256, std::int64_t min_8bit_size = 4096);
  std::string_view name() const override { return "Lion8bit"; }

 protected:
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;
};

}  // namespace memtrain::optim
