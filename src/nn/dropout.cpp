#include "memtrain/nn/dropout.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"

namespace memtrain::nn {

Dropout::Dropout(double p) : p_(p) {
  MT_CHECK(p >= 0.0 && p < 1.0, "nn::Dropout", "p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) const {
  if (p_ == 0.0 || !is_training()) return x;  // no RNG draw, so eval and p=0 leave the stream untouched
  return ops::dropout(x, p_, true);
}

}  // namespace memtrain::nn
