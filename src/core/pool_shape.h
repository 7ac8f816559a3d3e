// The geometry of 2-D pooling over the last two dims, shared by the backends' pooling entries: each builds its
// kernels' shape struct from it (cpu::Pool2dShape, cuda::Pool2dShape: the same fields in the same order).
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>

namespace memtrain::detail {

// S {planes, H, W, kernel, stride, padding, OH, OW} for input `in` [..., H, W] and output `out` [..., OH, OW];
// planes is the product of the leading dims.
template <typename S>
S pool2d_shape(const Tensor& in, const Tensor& out, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  std::int64_t planes = 1;
  for (std::int64_t d = 0; d < in.dim() - 2; ++d) planes *= in.size(d);
  return {planes, in.size(-2), in.size(-1), kernel, stride, padding, out.size(-2), out.size(-1)};
}

}  // namespace memtrain::detail
