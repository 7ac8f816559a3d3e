// GPT-2 MLP: c_fc [4C, C] -> gelu (tanh approximation) -> c_proj [C, 4C] -> dropout.
// c_proj's weight is initialised with std 0.02 / sqrt(2 * n_layer) (GPT-2's scaling of residual projections).
// With a TensorShard of count T > 1 the layer holds 4C/T hidden units: c_fc's rows for them ([4C/T, C],
// column-parallel) and c_proj's columns ([C, 4C/T], row-parallel, summed over the group before its bias).
#pragma once

#include "memtrain/nn/dropout.h"
#include "memtrain/nn/linear.h"
#include "memtrain/nn/tensor_shard.h"

#include <memory>

namespace memtrain::nn {

class MLP : public Module {
 public:
  MLP(std::int64_t n_embd, std::int64_t n_layer, bool bias = true, double dropout = 0.0, DType dtype = DType::f32,
      const TensorShard& shard = {});
  Tensor forward(const Tensor& x) const;  // x [B, T, C] -> [B, T, C]

 private:
  TensorShard shard_;
  std::shared_ptr<Linear> c_fc_;
  std::shared_ptr<Linear> c_proj_;
  std::shared_ptr<Dropout> dropout_;
};

}  // namespace memtrain::nn
