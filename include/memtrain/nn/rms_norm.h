// RMSNorm over the last dim: x / rms(x) * weight, weight [C] init 1.
#pragma once

#include "memtrain/nn/module.h"

namespace memtrain::nn {

class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::int64_t dim, double eps = 1e-6, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) const;  // x [..., C] -> [..., C]
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
  double eps_;
};

}  // namespace memtrain::nn
