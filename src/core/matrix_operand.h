// A matrix operand of a GEMM read straight from a tensor's strides: (data, transposed?, leading dim, batch
// stride), so the transposed views backward makes cost no copies. Shared by the CPU and CUDA GEMM entries.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>

namespace memtrain::detail {

struct MatrixOperand {
  Tensor tensor;  // keeps the data alive (may be a contiguous copy)
  bool trans = false;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
};

// Stride between consecutive matrices when the batch dims [0, rank-2) collapse into one; -1 if they don't.
inline std::int64_t collapsed_batch_stride(const Tensor& t) {
  std::int64_t stride = -1, expected = -1;
  for (std::int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (stride == -1) {
      stride = t.stride(d);
    } else if (t.stride(d) != expected) {
      return -1;
    }
    expected = t.stride(d) * t.size(d);
  }
  return stride == -1 ? 0 : stride;
}

// t as a GEMM operand; a contiguous copy (on t's device) only when its layout is neither row- nor column-major.
inline MatrixOperand as_operand(const Tensor& t) {
  const std::int64_t rows = t.size(-2), cols = t.size(-1);
  const std::int64_t batch = collapsed_batch_stride(t);
  // Row-major: unit column stride and rows that do not overlap; column-major (a transposed view) likewise.
  if (batch >= 0 && (t.stride(-1) == 1 || cols == 1) && (rows == 1 || t.stride(-2) >= cols)) {
    return {t, false, rows == 1 ? cols : t.stride(-2), batch};
  }
  if (batch >= 0 && (t.stride(-2) == 1 || rows == 1) && (cols == 1 || t.stride(-1) >= rows)) {
    return {t, true, cols == 1 ? rows : t.stride(-1), batch};
  }
  const Tensor c = t.detach().contiguous();
  return {c, false, cols, collapsed_batch_stride(c)};
}

}  // namespace memtrain::detail
