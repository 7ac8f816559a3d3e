#include "cpu/gelu.h"

#include "cpu/fast_exp.h"

#include <algorithm>
#include <cmath>

// The vector helpers below take and return 8-lane vectors; see the -Wpsabi note in cpu/fast_exp.h.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace memtrain::cpu {

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;                  // GPT-2's coefficient
constexpr int64_t kBlock = 4096;                     // elements per OpenMP task: whole vectors, L1-sized

// s = sigmoid(2u) = 0.5 (1 + tanh u) for eight lanes; du = u'(x).
inline vec::f8 half_one_plus_tanh(vec::f8 x, vec::f8& du) {
  const float k0 = static_cast<float>(kSqrt2OverPi), k1 = static_cast<float>(kCubic);
  const vec::f8 x2 = x * x;
  const vec::f8 u = k0 * (x + k1 * x2 * x);
  du = k0 * (1.0f + 3.0f * k1 * x2);
  return 1.0f / (1.0f + vec::exp(-2.0f * u));
}

void forward_block(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  vec::f8 du;
  for (; i + 8 <= n; i += 8) {
    const vec::f8 v = vec::load(x + i);
    vec::store(y + i, v * half_one_plus_tanh(v, du));
  }
  for (; i < n; ++i) {  // the tail through the same lanes, so it matches the body bit for bit
    const vec::f8 v = vec::splat(x[i]);
    y[i] = (v * half_one_plus_tanh(v, du))[0];
  }
}

// gelu' = 0.5 (1 + t) + 0.5 x (1 - t^2) u' = s + 2 x s (1 - s) u', with s = 0.5 (1 + t).
inline vec::f8 grad8(vec::f8 g, vec::f8 v) {
  vec::f8 du;
  const vec::f8 s = half_one_plus_tanh(v, du);
  return g * (s + 2.0f * v * s * (1.0f - s) * du);
}

void backward_block(float* dx, const float* dy, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vec::store(dx + i, grad8(vec::load(dy + i), vec::load(x + i)));
  for (; i < n; ++i) dx[i] = grad8(vec::splat(dy[i]), vec::splat(x[i]))[0];
}

double gelu_f64(double x) {
  const double u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

double gelu_grad_f64(double x) {
  const double u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const double t = std::tanh(u);
  const double du = kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

}  // namespace

template <>
void gelu_tanh_forward<float>(float* y, const float* x, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    forward_block(y + i0, x + i0, std::min(kBlock, n - i0));
  }
}

template <>
void gelu_tanh_backward<float>(float* dx, const float* dy, const float* x, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    backward_block(dx + i0, dy + i0, x + i0, std::min(kBlock, n - i0));
  }
}

template <>
void gelu_tanh_forward<double>(double* y, const double* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_f64(x[i]);
}

template <>
void gelu_tanh_backward<double>(double* dx, const double* dy, const double* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_grad_f64(x[i]);
}

}  // namespace memtrain::cpu
