// Matrix products. CPU: oneDNN (fp32, bf16) with an Eigen fallback; bf16 inputs accumulate in fp32.
#pragma once

#include "memtrain/core/tensor.h"

namespace memtrain::ops {

// a [..., m, k] x b [..., k, n] -> [..., m, n]. 1-D operands are not accepted; batch dims must be equal or
// b may be 2-D (shared across the batch). Transposed views are multiplied without copying.
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] x weight [out, in]^T + bias [out] -> [..., out]. bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace memtrain::ops
