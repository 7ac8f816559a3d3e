#include "memtrain/nn/rms_norm.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"

namespace memtrain::nn {

RMSNorm::RMSNorm(std::int64_t dim, double eps, DType dtype) : eps_(eps) {
  MT_CHECK(dim > 0, "nn::RMSNorm", "dim must be positive, got {}", dim);
  weight_ = register_parameter("weight", new_parameter({dim}, dtype).fill_(1.0));
}

Tensor RMSNorm::forward(const Tensor& x) const { return ops::rms_norm(x, weight_, eps_); }

}  // namespace memtrain::nn
