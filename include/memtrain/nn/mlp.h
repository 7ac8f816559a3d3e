// GPT-2 MLP: c_fc [4C, C] -> gelu (tanh approximation) -> c_proj [C, 4C] -> dropout.
// c_proj's weight is initialised with std 0.02 / sqrt(2 * n_layer) (GPT-2's scaling of residual projections).
#pragma once

#include "memtrain/nn/dropout.h"
#include "memtrain/nn/linear.h"

#include <memory>

namespace memtrain::nn {

class MLP : public Module {
 public:
  MLP(std::int64_t n_embd, std::int64_t n_layer, bool bias = true, double dropout = 0.0, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) const;  // x [B, T, C] -> [B, T, C]

 private:
  std::shared_ptr<Linear> c_fc_;
  std::shared_ptr<Linear> c_proj_;
  std::shared_ptr<Dropout> dropout_;
};

}  // namespace memtrain::nn
