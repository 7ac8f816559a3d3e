// exp for the hot loops of the CPU kernels (cross entropy, attention, softmax, GELU). glibc's expf is
// accurate but scalar: without -ffast-math GCC calls no vector variant, and its vectorizer will not
// if-convert the range checks of a hand-written exp (they might trap), so a loop over exp runs one
// element at a time. Here the float path is written on GCC/Clang vector extensions (8 lanes: one AVX2
// register under -march=native, two SSE registers otherwise), with the same formula for the scalar tail,
// so every element gets bit-identical results whatever its position.
//
// Algorithm (Cephes expf): n = round(x / ln2) with the 1.5 * 2^23 shifter trick, r = x - n ln2 in two
// parts (|r| <= ln2 / 2), e^r by a degree-6 polynomial, times 2^n built in the exponent bits. Relative
// error < 1e-7 (about 1 ulp) over the range. Below -87.3 the result is 0 (exp(-inf) = 0); above 88 it
// saturates at e^88 (1.65e38) instead of overflowing: the callers exponentiate x - max <= 0, or -2u in
// GELU, where e^88 already makes the result 0. NaN stays NaN. The double overloads are std::exp: the f64
// kernels exist for gradient checks and keep libm's accuracy.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

// Without -mavx the 32-byte vectors travel in two SSE registers and GCC warns that this differs from the
// AVX calling convention; every function here is inline, so no such call crosses a library boundary. Not
// popped: GCC reports it where an inline function is finally emitted, at the end of the including file.
#if defined(__GNUC__)  // GCC and Clang
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace memtrain::cpu {

namespace vec {

using f8 = float __attribute__((vector_size(32)));
using i8 = std::int32_t __attribute__((vector_size(32)));

inline f8 load(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, f8 v) { std::memcpy(p, &v, sizeof(v)); }
inline f8 splat(float s) { return f8{} + s; }
// mask ? a : b, lane by lane (mask lanes are all ones or all zeros, as comparisons produce).
inline f8 select(i8 mask, f8 a, f8 b) { return (f8)(((i8)a & mask) | ((i8)b & ~mask)); }
inline float hsum(f8 v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

inline f8 exp(f8 x) {
  const f8 lo = splat(-87.33654f), hi = splat(88.0f), shifter = splat(12582912.0f);  // 1.5 * 2^23
  const i8 below = x < lo;
  f8 xc = select(below, lo, x);  // NaN fails every compare and passes through
  xc = select(xc > hi, hi, xc);
  const f8 t = xc * 1.44269504088896341f + shifter;  // n sits in the low mantissa bits of t
  const f8 n = t - shifter;
  const i8 ni = (i8)t - (i8)shifter;
  f8 r = xc - n * 0.693359375f;  // ln2 = 0.693359375 - 2.12194440e-4, the first part exact in float
  r = r + n * 2.12194440e-4f;
  f8 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return select(below, f8{}, p * (f8)((ni + 127) << 23));
}

}  // namespace vec

// One element through the same lanes (so a tail matches the vector body bit for bit).
inline float vexp(float x) { return vec::exp(vec::splat(x))[0]; }
inline double vexp(double x) { return std::exp(x); }

// y[i] = exp(x[i] - shift) for i < n (not stored when y is null); returns the sum of those values.
// y may alias x.
inline float exp_shifted(const float* x, float shift, float* y, std::int64_t n) {
  vec::f8 acc{};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const vec::f8 e = vec::exp(vec::load(x + i) - shift);
    if (y) vec::store(y + i, e);
    acc += e;
  }
  float s = vec::hsum(acc);
  for (; i < n; ++i) {
    const float e = vexp(x[i] - shift);
    if (y) y[i] = e;
    s += e;
  }
  return s;
}
inline double exp_shifted(const double* x, double shift, double* y, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double e = std::exp(x[i] - shift);
    if (y) y[i] = e;
    s += e;
  }
  return s;
}

// y[i] = scale * exp(x[i] - shift) for i < n. y may alias x.
inline void exp_shifted_scaled(const float* x, float shift, float scale, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) vec::store(y + i, scale * vec::exp(vec::load(x + i) - shift));
  for (; i < n; ++i) y[i] = scale * vexp(x[i] - shift);
}
inline void exp_shifted_scaled(const double* x, double shift, double scale, double* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = scale * std::exp(x[i] - shift);
}

}  // namespace memtrain::cpu
