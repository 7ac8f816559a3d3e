// A matrix operand of a GEMM read straight from a tensor's strides: (data, transposed?, leading dim, batch
// stride), so the transposed views backward makes cost no copies. Shared by the CPU and CUDA GEMM entries.
#pragma once

#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"

#include <algorithm>
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

// The sizes of Backend::gemm_f32's out [m, n] = op(a) [m, k] op(b) [k, n] and out's row stride, after checking what
// its kernels take: 2-D operands on one device (out f32; a and b both f32, bf16 or f16), sizes that agree, out
// row-major (unit column stride, rows apart). Throws naming "gemm_f32" and the operands.
struct GemmDims {
  std::int64_t m = 0, n = 0, k = 0, ldc = 0;
};

inline GemmDims check_gemm_operands(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  constexpr const char* op = "gemm_f32";
  MT_CHECK(out.dim() == 2 && a.dim() == 2 && b.dim() == 2, op, "expects 2-D out, a and b, got {}, {} and {}",
           shape_str(out.shape()), shape_str(a.shape()), shape_str(b.shape()));
  const bool operands_ok = a.dtype() == b.dtype() &&
                           (a.dtype() == DType::f32 || a.dtype() == DType::bf16 || a.dtype() == DType::f16);
  MT_CHECK(out.dtype() == DType::f32 && operands_ok, op,
           "expects an f32 out and a, b both f32, bf16 or f16, got {}, {} and {}", dtype_name(out.dtype()),
           dtype_name(a.dtype()), dtype_name(b.dtype()));
  MT_CHECK(a.device() == out.device() && b.device() == out.device(), op, "out on {}, a on {}, b on {}: one device",
           out.device().str(), a.device().str(), b.device().str());
  GemmDims d;
  d.m = trans_a ? a.size(1) : a.size(0);
  d.k = trans_a ? a.size(0) : a.size(1);
  d.n = trans_b ? b.size(0) : b.size(1);
  const std::int64_t kb = trans_b ? b.size(1) : b.size(0);
  MT_CHECK(kb == d.k && out.size(0) == d.m && out.size(1) == d.n, op,
           "op(a) of a {} (trans_a {}) times op(b) of b {} (trans_b {}) does not give out {}", shape_str(a.shape()),
           trans_a, shape_str(b.shape()), trans_b, shape_str(out.shape()));
  MT_CHECK((out.stride(1) == 1 || d.n == 1) && (d.m == 1 || out.stride(0) >= d.n), op,
           "out {} with strides {} is not row-major", shape_str(out.shape()), shape_str(out.strides()));
  d.ldc = std::max<std::int64_t>(1, d.m == 1 ? d.n : out.stride(0));
  return d;
}

}  // namespace memtrain::detail
