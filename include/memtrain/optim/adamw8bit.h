// AdamW with 8-bit block-wise moments (Dettmers et al. 2022). Same math as fp32 AdamW: decoupled weight
// decay, bias correction, eps added after the square root. State per parameter of n >= min_8bit_size
// elements: "exp_avg.codes" (u8 [n], signed map), "exp_avg.absmax" (f32 [ceil(n/block)]),
// "exp_avg_sq.codes", "exp_avg_sq.absmax" (unsigned map) = 2n + 8 ceil(n/block) bytes; smaller parameters
// keep "exp_avg" and "exp_avg_sq" in f32 (8n bytes). Parameters and gradients are f32. The epsilon form is
// AdamW's (adamw.h: torch or hf).
#pragma once

#include "memtrain/optim/adamw.h"
#include "memtrain/optim/blockwise_optimizer.h"

#include <cstdint>

namespace memtrain::optim {

class AdamW8bit : public BlockwiseOptimizer {
 public:
  AdamW8bit(std::vector<ParamGroup> groups, std::int64_t block_size = 256, std::int64_t min_8bit_size = 4096,
            AdamEpsMode eps_mode = AdamEpsMode::torch);
  std::string_view name() const override { return "AdamW8bit"; }

 protected:
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;

 private:
  AdamEpsMode eps_mode_;
};

}  // namespace memtrain::optim
