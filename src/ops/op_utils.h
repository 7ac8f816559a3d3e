// Shared helpers of the op front-ends: argument checks, broadcasting and dtype dispatch.
#pragma once

#include "cpu/cpu_backend.h"
#include "memtrain/core/tensor.h"

#include <cstdint>
#include <utility>

namespace memtrain::ops::detail {

// Both defined, same dtype and device; the message names the op and both shapes/dtypes.
void check_same(const char* op, const Tensor& a, const Tensor& b);
void check_defined(const char* op, const Tensor& a);
void check_floating(const char* op, const Tensor& a);
std::int64_t wrap_dim(const char* op, std::int64_t dim, std::int64_t rank);
// The same, naming the tensor's shape in the error.
std::int64_t wrap_dim(const char* op, std::int64_t dim, const Shape& shape);

// numpy broadcasting of two shapes; throws naming the op when they are incompatible.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// Strides that read `t` as if expanded to `shape` (0 on broadcast dims); shape must be broadcastable.
Shape broadcast_strides(const Tensor& t, const Shape& shape);

// The dtype a CPU kernel computes in (the CPU backend's rule): f64 stays f64, other floats compute in f32.
using ::memtrain::cpu::compute_dtype;
// `t`, detached, in its compute dtype (no copy when it already is). For kernels: records nothing.
Tensor to_compute(const Tensor& t);

// Calls f(float{}) or f(double{}) for a compute dtype.
template <typename F>
decltype(auto) dispatch_compute(const char* op, DType t, F&& f) {
  if (t == DType::f32) return f(float{});
  MT_CHECK(t == DType::f64, op, "no CPU kernel for dtype {}", dtype_name(t));
  return f(double{});
}

}  // namespace memtrain::ops::detail
