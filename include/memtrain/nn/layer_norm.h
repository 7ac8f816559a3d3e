// LayerNorm over the last dim: weight [C] (init 1) and, with bias, bias [C] (init 0).
#pragma once

#include "memtrain/nn/module.h"

namespace memtrain::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t dim, bool bias = true, double eps = 1e-5, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) const;  // x [..., C] -> [..., C]
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_;
  Tensor bias_;
  double eps_;
};

}  // namespace memtrain::nn
