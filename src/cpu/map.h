// Elementwise map kernels over strided (possibly broadcast) inputs into a contiguous output. Every
// elementwise op's CPU kernel is one of these with a lambda; the contiguous case runs as one flat,
// OpenMP-parallel, vectorizable loop.
#pragma once

#include "cpu/strided.h"
#include "memtrain/core/tensor.h"

#include <cstdint>

namespace memtrain::cpu {

inline constexpr std::int64_t kParallelGrain = 1 << 15;  // elements below which threads cost more than they save

// Strides that read t as if expanded to `shape` (0 on broadcast and size-1 dims: map_binary's dense test
// then sees a [1, C] operand as broadcast).
inline Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const std::size_t n = shape.size(), r = static_cast<std::size_t>(t.dim());
  Shape strides(n, 0);
  for (std::size_t i = 0; i < r; ++i) strides[n - r + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return strides;
}

// A map's operand: t detached, in its compute dtype (f64, else f32; no copy when it already is), strides kept.
inline Tensor widened(const Tensor& t) {
  return t.detach().to(t.dtype() == DType::f64 ? DType::f64 : DType::f32);
}

// out[i] = f(in[i]); out contiguous with in's shape; T is the element type of both.
template <typename T, typename U = T, typename F>
void map_unary(const Tensor& in, Tensor& out, F f) {
  const T* x = in.data<T>();
  U* y = out.data<U>();
  const std::int64_t n = in.numel();
  if (in.is_contiguous()) {
#pragma omp parallel for simd if (n > kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
    return;
  }
  std::int64_t pos = 0;
  for_each_run<1>(in.shape(), {&in.strides()}, [&](auto off, std::int64_t count, auto inner) {
    for (std::int64_t j = 0; j < count; ++j) y[pos + j] = f(x[off[0] + j * inner[0]]);
    pos += count;
  });
}

// out[i] = f(a[i'], b[i'']) with a and b read through broadcast strides; out contiguous of `shape`.
template <typename T, typename U = T, typename F>
void map_binary(const T* a, const Shape& a_strides, const T* b, const Shape& b_strides, U* out, const Shape& shape,
                F f) {
  const std::int64_t n = shape_numel(shape);
  const Shape dense = contiguous_strides(shape);
  if (a_strides == dense && b_strides == dense) {
#pragma omp parallel for simd if (n > kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
    return;
  }
  std::int64_t pos = 0;
  for_each_run<2>(shape, {&a_strides, &b_strides}, [&](auto off, std::int64_t count, auto inner) {
    const T* pa = a + off[0];
    const T* pb = b + off[1];
    U* po = out + pos;
    if (inner[0] == 1 && inner[1] == 1) {
      for (std::int64_t j = 0; j < count; ++j) po[j] = f(pa[j], pb[j]);
    } else if (inner[0] == 1 && inner[1] == 0) {
      const T vb = *pb;
      for (std::int64_t j = 0; j < count; ++j) po[j] = f(pa[j], vb);
    } else {
      for (std::int64_t j = 0; j < count; ++j) po[j] = f(pa[j * inner[0]], pb[j * inner[1]]);
    }
    pos += count;
  });
}

}  // namespace memtrain::cpu
