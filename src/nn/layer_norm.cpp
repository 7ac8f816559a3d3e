#include "memtrain/nn/layer_norm.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"

namespace memtrain::nn {

LayerNorm::LayerNorm(std::int64_t dim, bool bias, double eps, DType dtype) : eps_(eps) {
  MT_CHECK(dim > 0, "nn::LayerNorm", "dim must be positive, got {}", dim);
  weight_ = register_parameter("weight", new_parameter({dim}, dtype).fill_(1.0));
  if (bias) bias_ = register_parameter("bias", new_parameter({dim}, dtype).zero_());
}

Tensor LayerNorm::forward(const Tensor& x) const { return ops::layer_norm(x, weight_, bias_, eps_); }

}  // namespace memtrain::nn
