#include "cpu/sigmoid.h"

#include "cpu/fast_exp.h"

#include <algorithm>
#include <cmath>

// The vector helpers below take and return 8-lane vectors; see the -Wpsabi note in cpu/fast_exp.h.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace memtrain::cpu {

namespace {

constexpr int64_t kBlock = 4096;  // elements per OpenMP task: whole vectors, L1-sized

inline vec::f8 sigmoid8(vec::f8 x) {
  const vec::i8 negative = x < 0.0f;
  const vec::f8 z = vec::exp(vec::select(negative, x, -x));  // e^-|x|; NaN stays NaN
  return vec::select(negative, z, vec::splat(1.0f)) / (1.0f + z);
}

inline vec::f8 silu8(vec::f8 x) { return x * sigmoid8(x); }

inline vec::f8 silu_grad8(vec::f8 g, vec::f8 x) {
  const vec::f8 s = sigmoid8(x);
  return g * s * (1.0f + x * (1.0f - s));
}

// f over the flat array in blocks, eight lanes at a time; the tail through the same lanes.
template <typename F>
void unary_blocks(float* y, const float* x, int64_t n, F f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock, end = std::min(n, i0 + kBlock);
    int64_t i = i0;
    for (; i + 8 <= end; i += 8) vec::store(y + i, f(vec::load(x + i)));
    for (; i < end; ++i) y[i] = f(vec::splat(x[i]))[0];
  }
}

double sigmoid_f64(double x) {
  const double z = std::exp(-std::abs(x));
  return x < 0 ? z / (1 + z) : 1 / (1 + z);
}

}  // namespace

template <>
void sigmoid_forward<float>(float* y, const float* x, int64_t n) {
  unary_blocks(y, x, n, sigmoid8);
}

template <>
void silu_forward<float>(float* y, const float* x, int64_t n) {
  unary_blocks(y, x, n, silu8);
}

template <>
void silu_backward<float>(float* dx, const float* dy, const float* x, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock, end = std::min(n, i0 + kBlock);
    int64_t i = i0;
    for (; i + 8 <= end; i += 8) vec::store(dx + i, silu_grad8(vec::load(dy + i), vec::load(x + i)));
    for (; i < end; ++i) dx[i] = silu_grad8(vec::splat(dy[i]), vec::splat(x[i]))[0];
  }
}

template <>
void sigmoid_forward<double>(double* y, const double* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = sigmoid_f64(x[i]);
}

template <>
void silu_forward<double>(double* y, const double* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_f64(x[i]);
}

template <>
void silu_backward<double>(double* dx, const double* dy, const double* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const double s = sigmoid_f64(x[i]);
    dx[i] = dy[i] * s * (1 + x[i] * (1 - s));
  }
}

}  // namespace memtrain::cpu
