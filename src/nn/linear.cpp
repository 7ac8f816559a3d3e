#include "memtrain/nn/linear.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/linalg.h"

namespace memtrain::nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias, DType dtype, double init_std) {
  MT_CHECK(in_features > 0 && out_features > 0, "nn::Linear", "features must be positive, got in {} out {}",
           in_features, out_features);
  Tensor w = new_parameter({out_features, in_features}, dtype);
  init_normal_(w, init_std);
  weight_ = register_parameter("weight", w);
  if (bias) bias_ = register_parameter("bias", new_parameter({out_features}, dtype).zero_());
}

Tensor Linear::forward(const Tensor& x) const { return ops::linear(x, weight_, bias_); }

}  // namespace memtrain::nn
