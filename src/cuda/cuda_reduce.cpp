// CUDA backend, host side of cuda/reduce.h: argument checks, the DType dispatch to the launchers
// of kernels/reduce_dims.cuh, and the f64 scratch of chunked sums.
//
// Every entry point checks its arguments first (so a bad call throws without touching a device), then
// requires the device, makes it current and enqueues on its current stream. Scratch goes back to
// the allocator's cache as soon as the kernels are enqueued: the cache hands a block only to work enqueued
// later on the same stream, and cudaFree (empty_cache) waits for the device (see cuda_nn.cpp).
#include "cuda/reduce.h"

#include "cuda/cuda_backend_entries.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"
#include "cuda/cuda_common.h"
#include "cuda/float_format.h"
#include "kernels/reduce_dims.cuh"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace memtrain::cuda {

namespace {

using detail::launch_stream;

// The reductions take f64, f32, f16 and bf16; no fp8.
std::optional<FloatFormat> float_format(DType t) {
  if (t == DType::f8_e4m3 || t == DType::f8_e5m2) return std::nullopt;
  return detail::float_format(t);
}

void check_dtype(const char* op, DType dtype) {
  MT_CHECK(float_format(dtype).has_value(), op, "dtype {} is not supported (f64, f32, f16, bf16)",
           dtype_name(dtype));
}

// Sizes non-negative, and outer * reduce * inner elements of 8 bytes addressable with int64.
void check_layout(const char* op, std::int64_t outer, std::int64_t reduce, std::int64_t inner) {
  MT_CHECK(outer >= 0 && reduce >= 0 && inner >= 0, op, "negative layout (outer {}, reduce {}, inner {})", outer,
           reduce, inner);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max() / 8;
  bool fits = true;
  std::int64_t n = 1;
  for (std::int64_t s : {outer, reduce, inner}) {
    if (s != 0 && n > kMax / s) fits = false;
    n = fits ? n * s : n;
  }
  MT_CHECK(fits, op, "layout (outer {}, reduce {}, inner {}) is too large", outer, reduce, inner);
}

using detail::Scratch;

void sum_impl(const char* op, const void* src, DType src_dtype, void* out, DType out_dtype, bool square,
              std::int64_t outer, std::int64_t reduce, std::int64_t inner, int device) {
  const std::int64_t outputs = outer * inner;
  if (outputs == 0) return;
  MT_CHECK(out != nullptr && (reduce == 0 || src != nullptr), op, "null pointer for layout (outer {}, reduce {}, inner {})",
           outer, reduce, inner);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  const SumPlan plan = plan_sum_dim(outer, reduce, inner);
  Scratch partials(device, reduce == 0 ? 0 : static_cast<std::size_t>(sum_dim_partials(plan, outer, inner)) * sizeof(double));
  MT_CUDA_CHECK(op, launch_sum_dim, src, *float_format(src_dtype), out, *float_format(out_dtype), square, outer,
                reduce, inner, plan, partials.as<double>(), launch_stream());
}

}  // namespace

void sum_dim(const void* src, void* out, DType dtype, std::int64_t outer, std::int64_t reduce, std::int64_t inner,
             int device) {
  constexpr const char* op = "cuda::sum_dim";
  check_dtype(op, dtype);
  check_layout(op, outer, reduce, inner);
  sum_impl(op, src, dtype, out, dtype, false, outer, reduce, inner, device);
}

void sum_of_squares(const void* src, DType dtype, std::size_t n, double* out, int device) {
  constexpr const char* op = "cuda::sum_of_squares";
  check_dtype(op, dtype);
  MT_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max() / 8), op, "{} elements is too many",
           n);
  sum_impl(op, src, dtype, out, DType::f64, true, 1, static_cast<std::int64_t>(n), 1, device);
}

void block_sums_of_squares(const void* src, DType dtype, std::size_t n, std::size_t block, double* out, int device) {
  constexpr const char* op = "cuda::block_sums_of_squares";
  check_dtype(op, dtype);
  MT_CHECK(block > 0, op, "block size 0 for {} elements", n);
  MT_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max() / 8), op, "{} elements is too many",
           n);
  // The whole blocks as one [blocks, block] reduction, then the short last block on its own.
  const auto whole = static_cast<std::int64_t>(n / block), tail = static_cast<std::int64_t>(n % block);
  const auto width = static_cast<std::int64_t>(block);
  sum_impl(op, src, dtype, out, DType::f64, true, whole, width, 1, device);
  if (tail == 0) return;
  const auto* last = static_cast<const char*>(src) + static_cast<std::size_t>(whole * width) * dtype_size(dtype);
  sum_impl(op, last, dtype, out + whole, DType::f64, true, 1, tail, 1, device);
}

void max_dim(const void* src, void* values, std::int64_t* indices, DType dtype, std::int64_t outer,
             std::int64_t reduce, std::int64_t inner, int device) {
  constexpr const char* op = "cuda::max_dim";
  check_dtype(op, dtype);
  check_layout(op, outer, reduce, inner);
  if (outer * inner == 0) return;  // no outputs: nothing to write
  MT_CHECK(values != nullptr || indices != nullptr, op, "no output: values and indices are both null");
  MT_CHECK(reduce > 0, op, "cannot take the max over an empty axis (outer {}, reduce 0, inner {})", outer, inner);
  MT_CHECK(src != nullptr, op, "null source for layout (outer {}, reduce {}, inner {})", outer, reduce, inner);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  MT_CUDA_CHECK(op, launch_max_dim, src, *float_format(dtype), values, indices, outer, reduce, inner, launch_stream());
}

}  // namespace memtrain::cuda

// ---- the CUDA backend's reduction entries (src/core/backend.h) ----

namespace memtrain::cuda {

// `a` as a contiguous [outer, reduce, inner] array for sum_dim. A contiguous input whose reduced dims
// (out's size-1 dims, ignoring a's size-1 dims) are adjacent is used in place; otherwise the kept dims are
// moved first and the reduced dims last in one strided copy (reduce = their product, inner = 1).
void CudaBackend::sum(const Tensor& out, const Tensor& a) const {
  const Shape& s = a.shape();
  const std::size_t rank = s.size();
  std::vector<bool> mask(rank);
  for (std::size_t i = 0; i < rank; ++i) mask[i] = out.shape()[i] == 1;
  std::size_t first = rank, last = 0;  // the first and last reduced dims of size != 1
  for (std::size_t i = 0; i < rank; ++i) {
    if (mask[i] && s[i] != 1) {
      first = std::min(first, i);
      last = i;
    }
  }
  bool in_place = a.is_contiguous();
  for (std::size_t i = first; in_place && i < last; ++i) in_place = mask[i] || s[i] == 1;
  Tensor x = a.detach();
  std::int64_t outer = 1, reduce = 1, inner = 1;
  if (in_place) {  // (when nothing of size > 1 is reduced, first == rank: all outer, a copy)
    for (std::size_t i = 0; i < rank; ++i) (i < first ? outer : i <= last ? reduce : inner) *= s[i];
  } else {
    Shape perm;
    for (std::size_t i = 0; i < rank; ++i)
      if (!mask[i]) perm.push_back(static_cast<std::int64_t>(i));
    for (std::size_t i = 0; i < rank; ++i)
      if (mask[i]) perm.push_back(static_cast<std::int64_t>(i));
    CategoryGuard category(MemoryCategory::workspace);  // freed when this returns
    x = x.permute(perm).contiguous();
    outer = out.numel();
    reduce = outer == 0 ? 0 : a.numel() / outer;
  }
  sum_dim(x.numel() == 0 ? nullptr : x.data_ptr(), out.data_ptr(), a.dtype(), outer, reduce, inner,
          a.device().index);
}

// A contiguous copy (when needed) viewed as [outer, n, inner] for max_dim.
void CudaBackend::max(const Tensor& values, const Tensor& indices, const Tensor& a, std::int64_t dim) const {
  if (indices.numel() == 0) return;  // another dim is empty: nothing to compute
  Tensor x = a.detach();
  if (!x.is_contiguous()) {
    CategoryGuard category(MemoryCategory::workspace);  // freed when this returns
    x = x.contiguous();
  }
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t k = 0; k < a.dim(); ++k) (k < dim ? outer : inner) *= k == dim ? 1 : a.shape()[k];
  max_dim(x.data_ptr(), values.defined() ? values.data_ptr() : nullptr, indices.data<std::int64_t>(), a.dtype(), outer,
          a.shape()[dim], inner, a.device().index);
}

}  // namespace memtrain::cuda
