// CUDA neural-net kernels (src/cuda/nn.h) against the CPU kernels of src/cpu/ on fresh random inputs:
// layer/RMS norm, softmax/log-softmax, cross entropy, GELU, dropout, embedding; f32 and bf16, odd shapes.
// Outputs are poisoned (0xFF bytes: NaN in f32 and bf16) before each call, so an unwritten element fails.
// bf16 inputs are bf16 values, and the CPU reference runs in f32 on exactly those values, so the only
// bf16 error is the final rounding (half an ulp, 2^-9 relative) plus f32 rounding differences.
// Device tests skip without a usable device; the argument checks run everywhere (they throw first).
#include "cuda/nn.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/cuda/cuda.h"

#include "cpu/cross_entropy.h"
#include "cpu/dropout.h"
#include "cpu/embedding.h"
#include "cpu/gelu.h"
#include "cpu/norm.h"
#include "cpu/softmax.h"

#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using test_support::DeviceBuffer;
using test_support::download;
using test_support::upload;

// ---- device buffers and bf16 on the host ----


std::uint16_t bf16_bits(float f) {  // round to nearest even
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }
float round_bf16(float f) { return bf16_value(bf16_bits(f)); }

// n elements of dtype (f32 or bf16) on cuda:0, filled with 0xFF bytes (NaN) until set.
class DeviceArray {
 public:
  DeviceArray(DType dtype, std::size_t n) : dtype_(dtype), n_(n), buf_(n * dtype_size(dtype)) { poison(); }
  void poison() { upload(buf_.get(), std::vector<std::uint8_t>(n_ * dtype_size(dtype_), 0xff)); }
  // v must hold values of dtype (see random_values).
  void set(const std::vector<float>& v) {
    ASSERT_EQ(v.size(), n_);
    if (dtype_ == DType::f32) {
      upload(buf_.get(), v);
    } else {
      std::vector<std::uint16_t> bits(n_);
      for (std::size_t i = 0; i < n_; ++i) bits[i] = bf16_bits(v[i]);
      upload(buf_.get(), bits);
    }
  }
  std::vector<float> get() const {
    if (dtype_ == DType::f32) return download<float>(buf_.get(), n_);
    const auto bits = download<std::uint16_t>(buf_.get(), n_);
    std::vector<float> v(n_);
    for (std::size_t i = 0; i < n_; ++i) v[i] = bf16_value(bits[i]);
    return v;
  }
  std::vector<std::uint32_t> raw_bits() const {  // f32: the bits; bf16: the 16 bits, widened
    std::vector<std::uint32_t> out(n_);
    if (dtype_ == DType::f32) return download<std::uint32_t>(buf_.get(), n_);
    const auto bits = download<std::uint16_t>(buf_.get(), n_);
    std::copy(bits.begin(), bits.end(), out.begin());
    return out;
  }
  void* ptr() const { return buf_.get(); }
  float* f32() const { return static_cast<float*>(buf_.get()); }

 private:
  DType dtype_;
  std::size_t n_;
  DeviceBuffer buf_;
};

// Uniform in [lo, hi), rounded to bf16 values when dtype is bf16.
std::vector<float> random_values(DType dtype, std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dtype == DType::bf16 ? round_bf16(dist(rng)) : dist(rng);
  return v;
}

// |got - want| <= atol + rtol |want| elementwise; NaN only where want is NaN. Reports the worst element.
struct Tol {
  double rtol, atol;
};
// extra: per-element absolute tolerance added to the bound (optional).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, Tol tol, const std::string& what,
                  const std::vector<double>* extra = nullptr) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, worst_i = 0;
  double worst = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    double ratio;
    if (std::isnan(w)) {
      ratio = std::isnan(g) ? 0.0 : INFINITY;
    } else {
      const double err = std::abs(g - w);
      const double bound = tol.atol + tol.rtol * std::abs(w) + (extra != nullptr ? (*extra)[i] : 0.0);
      ratio = std::isnan(err) ? INFINITY : err / bound;
    }
    bad += !(ratio <= 1.0);
    if (ratio > worst) worst = ratio, worst_i = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": worst at " << worst_i << ": got " << got[worst_i] << ", want " << want[worst_i]
                     << " (error / tolerance " << worst << ")";
}

// Bit patterns equal (f32 bits, or bf16 bits widened), without printing whole vectors on failure.
template <typename T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && wrong++ == 0) first = i;
  }
  EXPECT_EQ(wrong, 0u) << what << ": first difference at " << first << ": " << got[first] << " vs " << want[first];
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const Tol kF32{1e-5, 1e-5};
const Tol kBF16{1e-2, 1e-2};
Tol tol_for(DType dtype) { return dtype == DType::f32 ? kF32 : kBF16; }

struct Shape2 {
  std::int64_t rows, cols;
};

// ---- layer norm / RMS norm ----

// Row shapes: single elements, odd sizes, the model widths (768..4096), and more rows than the row
// kernels' grid (65535 blocks) so the row loop wraps.
const Shape2 kNormShapes[] = {{1, 1}, {3, 3}, {127, 127}, {5, 768}, {64, 1000}, {7, 4097}, {33, 4096}, {70000, 3}};

// Column sums over rows of |term|: the scale the dweight/dbias rounding error is relative to.
std::vector<double> abs_column_sums(std::int64_t N, std::int64_t C,
                                    const std::function<double(std::int64_t, std::int64_t)>& term) {
  std::vector<double> s(static_cast<std::size_t>(C), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) s[c] += std::abs(term(n, c));
  return s;
}

// dweight / dbias: sums over N rows in f32 on both sides, in different orders. Each side's error is
// about 2^-24 * sum |terms| typically (worst case N times that); we allow 1e-5 * sum |terms| plus the
// dtype's relative tolerance (1e-4 for f32: the "~1e-4 relative" of a sum over many rows).
void expect_column_sums(const std::vector<float>& got, const std::vector<float>& want,
                        const std::vector<double>& scale, DType dtype, const std::string& what) {
  std::size_t bad = 0, first = 0;
  const double rtol = dtype == DType::f32 ? 1e-4 : 1e-2;
  for (std::size_t c = 0; c < got.size(); ++c) {
    const double err = std::abs(static_cast<double>(got[c]) - want[c]);
    if (!(err <= rtol * std::abs(want[c]) + 1e-5 * scale[c] + 1e-6)) {
      if (bad++ == 0) first = c;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first bad column " << first << ": got " << got[first] << ", want " << want[first]
                     << ", sum |terms| " << scale[first];
}

void check_layer_norm(DType dtype, Shape2 s, bool affine) {
  const auto [N, C] = s;
  SCOPED_TRACE(fmt::format("layer_norm {} N={} C={} affine={}", dtype_name(dtype), N, C, affine));
  const std::size_t nc = static_cast<std::size_t>(N * C);
  const std::uint64_t seed = static_cast<std::uint64_t>(N * 7919 + C + affine);
  auto x = random_values(dtype, nc, -2.f, 2.f, seed);
  for (std::size_t i = 0; i < nc; ++i) x[i] = dtype == DType::bf16 ? round_bf16(x[i] + 1.f) : x[i] + 1.f;  // mean ~1
  const auto w = random_values(dtype, static_cast<std::size_t>(C), 0.5f, 1.5f, seed + 1);
  const auto b = random_values(dtype, static_cast<std::size_t>(C), -0.5f, 0.5f, seed + 2);
  const auto dout = random_values(dtype, nc, -1.f, 1.f, seed + 3);
  const double eps = 1e-5;

  // CPU reference in f32 on the same values.
  std::vector<float> out_ref(nc), mean_ref(N), rstd_ref(N), dx_ref(nc), dw_ref(C), db_ref(C);
  const float* wp = affine ? w.data() : nullptr;
  const float* bp = affine ? b.data() : nullptr;
  cpu::layer_norm_forward<float>(out_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(), wp, bp, N, C, eps);
  cpu::layer_norm_backward<float>(dx_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), x.data(), wp,
                                  mean_ref.data(), rstd_ref.data(), N, C);

  DeviceArray dx_in(dtype, nc), dw(dtype, C), db(dtype, C), dout_dev(dtype, nc);
  DeviceArray dy(dtype, nc), dmean(DType::f32, N), drstd(DType::f32, N);
  dx_in.set(x);
  dw.set(w);
  db.set(b);
  cuda::layer_norm_forward(dy.ptr(), dmean.f32(), drstd.f32(), dx_in.ptr(), affine ? dw.ptr() : nullptr,
                           affine ? db.ptr() : nullptr, dtype, N, C, eps, 0);
  // The GPU's mean is an f32 sum (the CPU's a double one): a few ulps of |x| <= 3, which enter out times
  // rstd * |weight| (rows of three close values have a large rstd).
  std::vector<double> extra(nc);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) extra[n * C + c] = 2e-6 * rstd_ref[n] * (affine ? std::abs(w[c]) : 1.0);
  expect_close(dy.get(), out_ref, tol_for(dtype), "out", &extra);
  // mean: f32 sums of up to 4097 values of |x| < 3 (error ~1e-6 at worst); rstd: relative.
  expect_close(dmean.get(), mean_ref, Tol{1e-5, 1e-5}, "mean");
  expect_close(drstd.get(), rstd_ref, Tol{1e-5, 0}, "rstd");
  // Without mean/rstd outputs (inference), the same output.
  DeviceArray dy2(dtype, nc);
  cuda::layer_norm_forward(dy2.ptr(), nullptr, nullptr, dx_in.ptr(), affine ? dw.ptr() : nullptr,
                           affine ? db.ptr() : nullptr, dtype, N, C, eps, 0);
  expect_same_bits(dy2.raw_bits(), dy.raw_bits(), "out without mean/rstd");

  // Backward from the CPU's statistics, so it is compared on identical inputs.
  DeviceArray ddx(dtype, nc), ddw(dtype, C), ddb(dtype, C), mean_in(DType::f32, N), rstd_in(DType::f32, N);
  dout_dev.set(dout);
  mean_in.set(mean_ref);
  rstd_in.set(rstd_ref);
  cuda::layer_norm_backward(ddx.ptr(), ddw.ptr(), ddb.ptr(), dout_dev.ptr(), dx_in.ptr(), affine ? dw.ptr() : nullptr,
                            mean_in.f32(), rstd_in.f32(), dtype, N, C, 0);
  auto norm = [&](std::int64_t n, std::int64_t c) { return (x[n * C + c] - mean_ref[n]) * rstd_ref[n]; };
  // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout * w: a difference of terms of size rstd |g|, which
  // may cancel to ~0 (C = 1 gives exactly 0); allow a few f32 ulps of the terms on top of the relative bound.
  std::vector<double> dx_extra(nc);
  for (std::int64_t n = 0; n < N; ++n) {
    double mean_g = 0, mean_gx = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double g = std::abs(dout[n * C + c] * (affine ? w[c] : 1.f));
      mean_g += g / C;
      mean_gx += g * std::abs(norm(n, c)) / C;
    }
    for (std::int64_t c = 0; c < C; ++c) {
      const double g = std::abs(dout[n * C + c] * (affine ? w[c] : 1.f));
      dx_extra[n * C + c] = 1e-6 * rstd_ref[n] * (g + mean_g + std::abs(norm(n, c)) * mean_gx);
    }
  }
  expect_close(ddx.get(), dx_ref, tol_for(dtype), "dx", &dx_extra);
  const auto dw_scale = abs_column_sums(N, C, [&](auto n, auto c) { return dout[n * C + c] * norm(n, c); });
  const auto db_scale = abs_column_sums(N, C, [&](auto n, auto c) { return dout[n * C + c]; });
  expect_column_sums(ddw.get(), dw_ref, dw_scale, dtype, "dweight");
  expect_column_sums(ddb.get(), db_ref, db_scale, dtype, "dbias");
  // dx alone (no parameter gradients) is the same.
  DeviceArray ddx2(dtype, nc);
  cuda::layer_norm_backward(ddx2.ptr(), nullptr, nullptr, dout_dev.ptr(), dx_in.ptr(), affine ? dw.ptr() : nullptr,
                            mean_in.f32(), rstd_in.f32(), dtype, N, C, 0);
  expect_same_bits(ddx2.raw_bits(), ddx.raw_bits(), "dx without dweight/dbias");
}

TEST(CudaNorm, LayerNormMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Shape2 s : kNormShapes) {
      if (dtype == DType::bf16 && s.rows > 10000) continue;  // the wrap is a row-loop property: f32 is enough
      check_layer_norm(dtype, s, true);
    }
    check_layer_norm(dtype, {127, 127}, false);
  }
}

void check_rms_norm(DType dtype, Shape2 s, bool affine) {
  const auto [N, C] = s;
  SCOPED_TRACE(fmt::format("rms_norm {} N={} C={} affine={}", dtype_name(dtype), N, C, affine));
  const std::size_t nc = static_cast<std::size_t>(N * C);
  const std::uint64_t seed = static_cast<std::uint64_t>(N * 104729 + C + affine);
  const auto x = random_values(dtype, nc, -2.f, 2.f, seed);
  const auto w = random_values(dtype, static_cast<std::size_t>(C), 0.5f, 1.5f, seed + 1);
  const auto dout = random_values(dtype, nc, -1.f, 1.f, seed + 2);
  const double eps = 1e-6;
  std::vector<float> out_ref(nc), rstd_ref(N), dx_ref(nc), dw_ref(C);
  const float* wp = affine ? w.data() : nullptr;
  cpu::rms_norm_forward<float>(out_ref.data(), rstd_ref.data(), x.data(), wp, N, C, eps);
  cpu::rms_norm_backward<float>(dx_ref.data(), dw_ref.data(), dout.data(), x.data(), wp, rstd_ref.data(), N, C);

  DeviceArray dx_in(dtype, nc), dw(dtype, C), dy(dtype, nc), drstd(DType::f32, N);
  dx_in.set(x);
  dw.set(w);
  cuda::rms_norm_forward(dy.ptr(), drstd.f32(), dx_in.ptr(), affine ? dw.ptr() : nullptr, dtype, N, C, eps, 0);
  expect_close(dy.get(), out_ref, tol_for(dtype), "out");
  expect_close(drstd.get(), rstd_ref, Tol{1e-5, 0}, "rstd");

  DeviceArray dout_dev(dtype, nc), rstd_in(DType::f32, N), ddx(dtype, nc), ddw(dtype, C);
  dout_dev.set(dout);
  rstd_in.set(rstd_ref);
  cuda::rms_norm_backward(ddx.ptr(), ddw.ptr(), dout_dev.ptr(), dx_in.ptr(), affine ? dw.ptr() : nullptr,
                          rstd_in.f32(), dtype, N, C, 0);
  expect_close(ddx.get(), dx_ref, tol_for(dtype), "dx");
  const auto dw_scale =
      abs_column_sums(N, C, [&](auto n, auto c) { return dout[n * C + c] * x[n * C + c] * rstd_ref[n]; });
  expect_column_sums(ddw.get(), dw_ref, dw_scale, dtype, "dweight");
}

TEST(CudaNorm, RmsNormMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Shape2 s : kNormShapes) {
      if (dtype == DType::bf16 && s.rows > 10000) continue;
      check_rms_norm(dtype, s, true);
    }
    check_rms_norm(dtype, {127, 127}, false);
  }
}

// dweight/dbias come from fixed-order partial sums: two runs give the same bits.
TEST(CudaNorm, BackwardIsDeterministic) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::int64_t N = 4096, C = 768;
  const std::size_t nc = N * C;
  DeviceArray x(DType::f32, nc), dout(DType::f32, nc), w(DType::f32, C), mean(DType::f32, N), rstd(DType::f32, N);
  x.set(random_values(DType::f32, nc, -2.f, 2.f, 11));
  dout.set(random_values(DType::f32, nc, -1.f, 1.f, 12));
  w.set(random_values(DType::f32, C, 0.5f, 1.5f, 13));
  DeviceArray y(DType::f32, nc);
  cuda::layer_norm_forward(y.ptr(), mean.f32(), rstd.f32(), x.ptr(), w.ptr(), nullptr, DType::f32, N, C, 1e-5, 0);
  std::vector<std::uint32_t> first_dw, first_db, first_rms;
  for (int run = 0; run < 2; ++run) {
    DeviceArray dx(DType::f32, nc), dw(DType::f32, C), db(DType::f32, C), rdw(DType::f32, C);
    cuda::layer_norm_backward(dx.ptr(), dw.ptr(), db.ptr(), dout.ptr(), x.ptr(), w.ptr(), mean.f32(), rstd.f32(),
                              DType::f32, N, C, 0);
    cuda::rms_norm_backward(dx.ptr(), rdw.ptr(), dout.ptr(), x.ptr(), w.ptr(), rstd.f32(), DType::f32, N, C, 0);
    if (run == 0) {
      first_dw = dw.raw_bits();
      first_db = db.raw_bits();
      first_rms = rdw.raw_bits();
    } else {
      expect_same_bits(dw.raw_bits(), first_dw, "layer_norm dweight");
      expect_same_bits(db.raw_bits(), first_db, "layer_norm dbias");
      expect_same_bits(rdw.raw_bits(), first_rms, "rms_norm dweight");
    }
  }
}

// ---- softmax / log-softmax ----

const Shape2 kSoftmaxShapes[] = {{1, 1}, {3, 3}, {127, 127}, {64, 1000}, {4, 4097}, {2, 50304}, {70000, 3}};

// Tolerances. f32: both sides do f32 max / sum-of-exp / exp with different exp implementations and
// summation orders: ~1e-6 relative; probabilities are compared relatively (atol 1e-7), log-probabilities
// (|value| up to ~20) with atol 1e-5. bf16: the output rounding, relative.
void check_softmax(DType dtype, Shape2 s, bool is_log) {
  const auto [N, C] = s;
  SCOPED_TRACE(fmt::format("{} {} N={} C={}", is_log ? "log_softmax" : "softmax", dtype_name(dtype), N, C));
  const std::size_t nc = static_cast<std::size_t>(N * C);
  const std::uint64_t seed = static_cast<std::uint64_t>(N * 31 + C * 7 + is_log);
  const auto x = random_values(dtype, nc, -6.f, 6.f, seed);
  const auto dout = random_values(dtype, nc, -1.f, 1.f, seed + 1);
  std::vector<float> y_ref(nc), dx_ref(nc);
  if (is_log) {
    cpu::log_softmax_forward<float>(y_ref.data(), x.data(), N, C, 1);
  } else {
    cpu::softmax_forward<float>(y_ref.data(), x.data(), N, C, 1);
  }
  DeviceArray dx_in(dtype, nc), dy(dtype, nc);
  dx_in.set(x);
  if (is_log) {
    cuda::log_softmax_forward(dy.ptr(), dx_in.ptr(), dtype, N, C, 0);
  } else {
    cuda::softmax_forward(dy.ptr(), dx_in.ptr(), dtype, N, C, 0);
  }
  const Tol fwd = dtype == DType::f32 ? Tol{1e-5, is_log ? 1e-5 : 1e-7} : Tol{1e-2, is_log ? 1e-2 : 1e-7};
  expect_close(dy.get(), y_ref, fwd, "out");

  // Backward on the forward output as the dtype holds it (the CPU gets the same values).
  std::vector<float> y_in = y_ref;
  if (dtype == DType::bf16)
    for (float& v : y_in) v = round_bf16(v);
  if (is_log) {
    cpu::log_softmax_backward<float>(dx_ref.data(), dout.data(), y_in.data(), N, C, 1);
  } else {
    cpu::softmax_backward<float>(dx_ref.data(), dout.data(), y_in.data(), N, C, 1);
  }
  DeviceArray y_dev(dtype, nc), dout_dev(dtype, nc), ddx(dtype, nc);
  y_dev.set(y_in);
  dout_dev.set(dout);
  if (is_log) {
    cuda::log_softmax_backward(ddx.ptr(), dout_dev.ptr(), y_dev.ptr(), dtype, N, C, 0);
  } else {
    cuda::softmax_backward(ddx.ptr(), dout_dev.ptr(), y_dev.ptr(), dtype, N, C, 0);
  }
  // dx uses a row sum s (sum dout * out, or sum dout) that both sides add in f32 in different orders; its
  // error is below 1e-5 * sum |terms| (typically ~1e-7 of it), and enters dx times out (or exp(out)).
  std::vector<double> extra(nc);
  for (std::int64_t n = 0; n < N; ++n) {
    double scale = 0;
    for (std::int64_t c = 0; c < C; ++c) scale += std::abs(dout[n * C + c] * (is_log ? 1.0f : y_in[n * C + c]));
    for (std::int64_t c = 0; c < C; ++c) {
      extra[n * C + c] = 1e-5 * scale * (is_log ? std::exp(static_cast<double>(y_in[n * C + c])) : y_in[n * C + c]);
    }
  }
  const Tol bwd = dtype == DType::f32 ? Tol{1e-5, 1e-6} : Tol{1e-2, 1e-4};
  expect_close(ddx.get(), dx_ref, bwd, "dx", &extra);
}

TEST(CudaSoftmax, SoftmaxAndLogSoftmaxMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Shape2 s : kSoftmaxShapes) {
      for (bool is_log : {false, true}) check_softmax(dtype, s, is_log);
    }
  }
}

// ---- cross entropy ----

template <typename I>
void check_cross_entropy(DType dtype, Shape2 s, std::int64_t ignore_index, std::int64_t dloss_stride) {
  const auto [N, V] = s;
  constexpr DType index_dtype = sizeof(I) == 4 ? DType::i32 : DType::i64;
  SCOPED_TRACE(fmt::format("cross_entropy {} {} N={} V={} ignore={} stride={}", dtype_name(dtype),
                           dtype_name(index_dtype), N, V, ignore_index, dloss_stride));
  const std::size_t nv = static_cast<std::size_t>(N * V);
  const std::uint64_t seed = static_cast<std::uint64_t>(N * 17 + V + sizeof(I));
  const auto logits = random_values(dtype, nv, -8.f, 8.f, seed);
  std::vector<I> targets(N);
  std::mt19937_64 rng(seed + 1);
  for (std::int64_t n = 0; n < N; ++n) {
    targets[n] = static_cast<I>(rng() % static_cast<std::uint64_t>(V));
    if (n % 5 == 2) targets[n] = static_cast<I>(ignore_index);  // some ignored rows
  }
  std::vector<float> loss_ref(N), lse_ref(N);
  cpu::cross_entropy_forward<float, I>(loss_ref.data(), lse_ref.data(), logits.data(), targets.data(), N, V,
                                       ignore_index);
  DeviceArray dlogits_in(dtype, nv), dloss_out(DType::f32, N), dlse(DType::f32, N);
  DeviceBuffer dtargets(N * sizeof(I));
  dlogits_in.set(logits);
  upload(dtargets.get(), targets);
  cuda::cross_entropy_forward(dloss_out.f32(), dlse.f32(), dlogits_in.ptr(), dtype, dtargets.get(), index_dtype, N, V,
                              ignore_index, 0);
  // Both sides compute in f32 from the same values (bf16 logits included): loss = lse - x[t] has an
  // absolute error of a few ulps of lse (~1e-6 for lse ~ 20).
  const auto loss_got = dloss_out.get(), lse_got = dlse.get();
  for (std::int64_t n = 0; n < N; ++n) {
    const double tol = 1e-5 * (1.0 + std::abs(lse_ref[n]));
    EXPECT_LE(std::abs(loss_got[n] - loss_ref[n]), tol) << "loss row " << n;
    EXPECT_LE(std::abs(lse_got[n] - lse_ref[n]), tol) << "lse row " << n;
    if (static_cast<std::int64_t>(targets[n]) == ignore_index) {
      EXPECT_EQ(loss_got[n], 0.0f) << "ignored row " << n;
    }
  }

  // Backward from the CPU's lse, with per-row dloss (stride 1) or one shared scale (stride 0).
  const std::size_t n_dloss = dloss_stride == 0 ? 1 : static_cast<std::size_t>(N * dloss_stride);
  const auto dloss = random_values(DType::f32, n_dloss, 0.1f, 2.f, seed + 2);
  std::vector<float> dlogits_ref(nv);
  cpu::cross_entropy_backward<float, I>(dlogits_ref.data(), dloss.data(), dloss_stride, logits.data(), lse_ref.data(),
                                        targets.data(), N, V, ignore_index);
  DeviceArray ddloss(DType::f32, n_dloss), dlse_in(DType::f32, N), ddlogits(dtype, nv);
  ddloss.set(dloss);
  dlse_in.set(lse_ref);
  cuda::cross_entropy_backward(ddlogits.ptr(), ddloss.f32(), dloss_stride, dlogits_in.ptr(), dlse_in.f32(), dtype,
                               dtargets.get(), index_dtype, N, V, ignore_index, 0);
  // g * exp(x - lse) with different exps (~1e-6 relative), minus g at the target (abs ~1e-7 * g).
  const Tol bwd = dtype == DType::f32 ? Tol{1e-5, 1e-6} : Tol{1e-2, 1e-5};
  const auto got = ddlogits.get();
  expect_close(got, dlogits_ref, bwd, "dlogits");
  for (std::int64_t n = 0; n < N; ++n) {
    if (static_cast<std::int64_t>(targets[n]) != ignore_index) continue;
    EXPECT_TRUE(std::all_of(got.begin() + n * V, got.begin() + (n + 1) * V, [](float v) { return v == 0.0f; }))
        << "ignored row " << n << " is not all zeros";
  }
}

TEST(CudaCrossEntropy, ForwardBackwardMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const Shape2 shapes[] = {{1, 1}, {3, 3}, {127, 1000}, {33, 4097}, {8, 50304}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Shape2 s : shapes) {
      check_cross_entropy<std::int32_t>(dtype, s, -100, 1);
      check_cross_entropy<std::int64_t>(dtype, s, -100, 0);
    }
    // ignore_index that is also a valid class; a dloss stride of 3 (a column of a wider array).
    check_cross_entropy<std::int64_t>(dtype, {127, 1000}, 1, 3);
  }
}

TEST(CudaCrossEntropy, OutOfRangeTargetGivesNaNNotABadRead) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::int64_t N = 3, V = 5;
  const std::vector<std::int32_t> targets = {1, 5, -1};  // row 0 fine, rows 1 and 2 out of range
  DeviceArray logits(DType::f32, N * V), losses(DType::f32, N), lse(DType::f32, N), dlogits(DType::f32, N * V);
  DeviceArray dloss(DType::f32, 1);
  DeviceBuffer dtargets(N * 4);
  logits.set(random_values(DType::f32, N * V, -1.f, 1.f, 5));
  dloss.set({1.f});
  upload(dtargets.get(), targets);
  cuda::cross_entropy_forward(losses.f32(), lse.f32(), logits.ptr(), DType::f32, dtargets.get(), DType::i32, N, V, -100,
                              0);
  cuda::cross_entropy_backward(dlogits.ptr(), dloss.f32(), 0, logits.ptr(), lse.f32(), DType::f32, dtargets.get(),
                               DType::i32, N, V, -100, 0);
  const auto l = losses.get(), d = dlogits.get();
  EXPECT_TRUE(std::isfinite(l[0]));
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_TRUE(std::isnan(l[2]));
  for (std::int64_t v = 0; v < V; ++v) {
    EXPECT_TRUE(std::isfinite(d[v]));
    EXPECT_TRUE(std::isnan(d[V + v]));
    EXPECT_TRUE(std::isnan(d[2 * V + v]));
  }
}

// ---- GELU ----

// f32: both compute 0.5 (1 + tanh u) as 1 / (1 + exp(-2u)) with different exps and (on the GPU) fused
// multiply-adds: relative differences up to ~2e-6 for |x| <= 6 (|2u| <= 25 amplifies u's rounding); atol
// 1e-6 covers the zero of gelu' near x = -0.75 and the saturated ends. bf16: the output rounding.
TEST(CudaGelu, ForwardBackwardMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{127}, std::size_t{1000}, std::size_t{4097},
                          (std::size_t{1} << 21) + 3}) {
      SCOPED_TRACE(fmt::format("gelu {} n={}", dtype_name(dtype), n));
      auto x = random_values(dtype, n, -6.f, 6.f, n);
      if (n >= 4) x[0] = 0.f, x[1] = -30.f, x[2] = 30.f, x[3] = -0.75f;  // saturated ends, the zero of gelu'
      const auto dy = random_values(dtype, n, -1.f, 1.f, n + 1);
      std::vector<float> y_ref(n), dx_ref(n);
      cpu::gelu_tanh_forward<float>(y_ref.data(), x.data(), static_cast<std::int64_t>(n));
      cpu::gelu_tanh_backward<float>(dx_ref.data(), dy.data(), x.data(), static_cast<std::int64_t>(n));
      DeviceArray dx_in(dtype, n), ddy(dtype, n), dy_out(dtype, n), ddx(dtype, n);
      dx_in.set(x);
      ddy.set(dy);
      cuda::gelu_tanh_forward(dy_out.ptr(), dx_in.ptr(), dtype, n, 0);
      cuda::gelu_tanh_backward(ddx.ptr(), ddy.ptr(), dx_in.ptr(), dtype, n, 0);
      const Tol tol = dtype == DType::f32 ? Tol{1e-5, 1e-6} : Tol{1e-2, 1e-5};
      expect_close(dy_out.get(), y_ref, tol, "y");
      expect_close(ddx.get(), dx_ref, tol, "dx");
      // In place: y written over x.
      cuda::gelu_tanh_forward(dx_in.ptr(), dx_in.ptr(), dtype, n, 0);
      expect_same_bits(dx_in.raw_bits(), dy_out.raw_bits(), "in-place y");
    }
  }
}

// ---- dropout ----

// The mask must be the CPU's bit for bit: f32 outputs are compared as bits (kept values are one f32
// multiply on both sides, dropped ones +0). bf16: the CPU's f32 result rounded to bf16, as bits.
TEST(CudaDropout, MatchesCpuBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const RngState states[] = {{0, 0}, {1234567, 0}, {0xdeadbeefcafef00dull, 0xfffffffeull}, {42, ~0ull - 5}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{127}, std::size_t{1000}, std::size_t{4097},
                          std::size_t{100003}}) {
      for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
        for (const RngState& state : states) {
          SCOPED_TRACE(fmt::format("dropout {} n={} p={} seed={} offset={}", dtype_name(dtype), n, p, state.seed,
                                   state.offset));
          const auto x = random_values(dtype, n, 0.5f, 2.f, n + 3);  // never 0: a kept element is non-zero
          std::vector<float> y_ref(n), dx_ref(n);
          cpu::dropout_forward<float>(y_ref.data(), x.data(), static_cast<std::int64_t>(n), p, state);
          cpu::dropout_backward<float>(dx_ref.data(), x.data(), static_cast<std::int64_t>(n), p, state);
          std::vector<std::uint32_t> want(n);
          for (std::size_t i = 0; i < n; ++i) {
            want[i] = dtype == DType::f32 ? std::bit_cast<std::uint32_t>(y_ref[i]) : bf16_bits(y_ref[i]);
          }
          DeviceArray dx(dtype, n), dy(dtype, n), ddx(dtype, n);
          dx.set(x);
          cuda::dropout_forward(dy.ptr(), dx.ptr(), dtype, n, p, state, 0);
          cuda::dropout_backward(ddx.ptr(), dx.ptr(), dtype, n, p, state, 0);
          const auto got = dy.raw_bits();
          std::size_t wrong = 0, kept = 0;
          for (std::size_t i = 0; i < n; ++i) {
            wrong += got[i] != want[i];
            kept += got[i] != 0;
          }
          EXPECT_EQ(wrong, 0u) << kept << " kept";
          expect_same_bits(ddx.raw_bits(), got, "backward");  // the same mask and scale
          expect_same_bits(dx_ref, y_ref, "cpu backward");
          if (n >= 4097 && p > 0.0 && p < 1.0) {  // the mask drops about p of the elements
            EXPECT_NEAR(1.0 - static_cast<double>(kept) / n, p, 0.05);
          }
          cuda::dropout_forward(dx.ptr(), dx.ptr(), dtype, n, p, state, 0);  // in place
          expect_same_bits(dx.raw_bits(), got, "in place");
        }
      }
    }
  }
}

// ---- embedding ----

template <typename I>
void check_embedding(DType dtype, std::int64_t N, std::int64_t V, std::int64_t C) {
  constexpr DType index_dtype = sizeof(I) == 4 ? DType::i32 : DType::i64;
  SCOPED_TRACE(fmt::format("embedding {} {} N={} V={} C={}", dtype_name(dtype), dtype_name(index_dtype), N, V, C));
  const std::uint64_t seed = static_cast<std::uint64_t>(N * 3 + V * 5 + C + sizeof(I));
  const auto weight = random_values(dtype, static_cast<std::size_t>(V * C), -1.f, 1.f, seed);
  const auto dout = random_values(dtype, static_cast<std::size_t>(N * C), -1.f, 1.f, seed + 1);
  std::vector<I> indices(N);
  std::mt19937_64 rng(seed + 2);
  for (auto& i : indices) i = static_cast<I>(rng() % static_cast<std::uint64_t>(V));  // many repeats when V < N

  // Forward: a copy, so exact.
  std::vector<float> out_ref(N * C);
  cpu::embedding_forward<float, I>(out_ref.data(), weight.data(), indices.data(), N, C);
  DeviceArray dweight(dtype, V * C), dout_dev(dtype, N * C), dy(dtype, N * C);
  DeviceBuffer dindices(N * sizeof(I));
  dweight.set(weight);
  dout_dev.set(dout);
  upload(dindices.get(), indices);
  cuda::embedding_forward(dy.ptr(), dweight.ptr(), dindices.get(), dtype, index_dtype, N, V, C, 0);
  expect_same_bits(dy.get(), out_ref, "forward");

  // Backward accumulates into dweight (here the weights, as a non-zero start). The CUDA kernel adds each
  // index's rows in increasing n in f32 starting from dweight, as the CPU does: bit-identical for f32;
  // for bf16 the CPU's f32 result rounded once, also exact.
  std::vector<float> dw_ref = weight;
  cpu::embedding_backward<float, I>(dw_ref.data(), dout.data(), indices.data(), N, C);
  if (dtype == DType::bf16)
    for (float& v : dw_ref) v = round_bf16(v);
  cuda::embedding_backward(dweight.ptr(), dout_dev.ptr(), dindices.get(), dtype, index_dtype, N, V, C, 0);
  expect_same_bits(dweight.get(), dw_ref, "dweight");
}

TEST(CudaEmbedding, ForwardCopiesAndBackwardIsBitIdenticalToCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  struct Case {
    std::int64_t N, V, C;
  };
  const Case cases[] = {{1, 1, 1}, {3, 7, 3}, {127, 7, 127}, {1000, 5000, 768}, {4097, 50304, 64}, {1000, 3, 4097},
                        {70000, 1000, 3}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      check_embedding<std::int32_t>(dtype, c.N, c.V, c.C);
      check_embedding<std::int64_t>(dtype, c.N, c.V, c.C);
    }
  }
}

TEST(CudaEmbedding, OutOfRangeIndicesGiveNaNRowsAndAreSkippedInBackward) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::int64_t N = 4, V = 3, C = 5;
  const std::vector<std::int64_t> indices = {2, -1, 3, 2};
  const auto weight = random_values(DType::f32, V * C, -1.f, 1.f, 1);
  const auto dout = random_values(DType::f32, N * C, -1.f, 1.f, 2);
  DeviceArray dw(DType::f32, V * C), ddout(DType::f32, N * C), dy(DType::f32, N * C);
  DeviceBuffer dindices(N * 8);
  dw.set(weight);
  ddout.set(dout);
  upload(dindices.get(), indices);
  cuda::embedding_forward(dy.ptr(), dw.ptr(), dindices.get(), DType::f32, DType::i64, N, V, C, 0);
  const auto y = dy.get();
  for (std::int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(y[c], weight[2 * C + c]);
    EXPECT_TRUE(std::isnan(y[C + c]));
    EXPECT_TRUE(std::isnan(y[2 * C + c]));
    EXPECT_EQ(y[3 * C + c], weight[2 * C + c]);
  }
  // Reference: the in-range rows only, in their order.
  std::vector<float> dw_ref = weight;
  const std::vector<std::int64_t> kept = {2, 2};
  std::vector<float> kept_dout(dout.begin(), dout.begin() + C);
  kept_dout.insert(kept_dout.end(), dout.begin() + 3 * C, dout.end());
  cpu::embedding_backward<float, std::int64_t>(dw_ref.data(), kept_dout.data(), kept.data(), 2, C);
  cuda::embedding_backward(dw.ptr(), ddout.ptr(), dindices.get(), DType::f32, DType::i64, N, V, C, 0);
  expect_same_bits(dw.get(), dw_ref, "dweight");
}

// ---- argument checks: before any device is touched, so they run everywhere ----

TEST(CudaNnArguments, BadArgumentsThrowNamingTheEntryPoint) {
  float fake[4] = {};  // never dereferenced: each call throws before touching memory
  void* p = fake;
  float* f = fake;
  auto expect_error = [&](const std::function<void()>& call, const std::string& op, const std::string& what) {
    const std::string message = error_of(call);
    EXPECT_EQ(message.rfind(op + ": ", 0), 0u) << message;
    const std::string want = cuda::built_with_cuda() ? what : "built without CUDA";
    EXPECT_NE(message.find(want), std::string::npos) << message;
  };
  expect_error([&] { cuda::layer_norm_forward(p, f, f, p, p, p, DType::f64, 2, 2, 1e-5, 0); },
               "cuda::layer_norm_forward", "dtype f64");
  expect_error([&] { cuda::layer_norm_forward(p, f, f, p, p, p, DType::f32, -1, 2, 1e-5, 0); },
               "cuda::layer_norm_forward", "negative size");
  expect_error([&] { cuda::layer_norm_forward(p, f, f, p, p, p, DType::f32, 2, 2, NAN, 0); },
               "cuda::layer_norm_forward", "eps=");
  expect_error([&] { cuda::layer_norm_forward(p, f, f, p, p, p, DType::f32, 2, 0, 1e-5, 0); },
               "cuda::layer_norm_forward", "C is 0");
  expect_error([&] { cuda::layer_norm_backward(nullptr, p, p, p, p, p, f, f, DType::f32, 2, 2, 0); },
               "cuda::layer_norm_backward", "null pointer");
  expect_error([&] { cuda::rms_norm_forward(p, f, p, p, DType::f64, 2, 2, 1e-5, 0); }, "cuda::rms_norm_forward",
               "dtype f64");
  expect_error([&] { cuda::rms_norm_backward(p, p, p, p, p, nullptr, DType::f32, 2, 2, 0); },
               "cuda::rms_norm_backward", "null pointer");
  expect_error([&] { cuda::softmax_forward(p, p, DType::i32, 2, 2, 0); }, "cuda::softmax_forward", "dtype i32");
  expect_error([&] { cuda::log_softmax_backward(p, p, nullptr, DType::f32, 2, 2, 0); }, "cuda::log_softmax_backward",
               "null pointer");
  expect_error([&] { cuda::softmax_forward(p, p, DType::f32, std::int64_t{1} << 40, std::int64_t{1} << 40, 0); },
               "cuda::softmax_forward", "overflow");
  expect_error([&] { cuda::cross_entropy_forward(f, f, p, DType::f32, p, DType::f32, 2, 2, -100, 0); },
               "cuda::cross_entropy_forward", "index dtype f32");
  expect_error([&] { cuda::cross_entropy_forward(f, f, p, DType::f32, p, DType::i32, 2, 0, -100, 0); },
               "cuda::cross_entropy_forward", "V is 0");
  expect_error([&] { cuda::cross_entropy_backward(p, f, -1, p, f, DType::f32, p, DType::i64, 2, 2, -100, 0); },
               "cuda::cross_entropy_backward", "dloss_stride=-1");
  expect_error([&] { cuda::gelu_tanh_forward(nullptr, p, DType::f32, 4, 0); }, "cuda::gelu_tanh_forward",
               "null pointer");
  expect_error([&] { cuda::gelu_tanh_backward(p, p, p, DType::i8, 4, 0); }, "cuda::gelu_tanh_backward", "dtype i8");
  expect_error([&] { cuda::dropout_forward(p, p, DType::f32, 4, 1.5, RngState{}, 0); }, "cuda::dropout_forward",
               "p=1.5");
  expect_error([&] { cuda::dropout_backward(p, p, DType::f32, 4, NAN, RngState{}, 0); }, "cuda::dropout_backward",
               "p=nan");
  expect_error([&] { cuda::embedding_forward(p, p, p, DType::f32, DType::u8, 2, 2, 2, 0); },
               "cuda::embedding_forward", "index dtype u8");
  expect_error([&] { cuda::embedding_backward(p, p, p, DType::f32, DType::i32, std::int64_t{1} << 31, 2, 2, 0); },
               "cuda::embedding_backward", "exceeds 2^31 - 1");
  expect_error([&] { cuda::embedding_backward(p, p, p, DType::f32, DType::i32, 2, 0, 2, 0); },
               "cuda::embedding_backward", "V is 0");
}

// Empty inputs return before any pointer or device is used.
TEST(CudaNnArguments, EmptyInputsDoNothing) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "memtrain was built without CUDA";
  EXPECT_NO_THROW(
      cuda::layer_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, DType::f32, 0, 8, 1e-5, 0));
  EXPECT_NO_THROW(cuda::rms_norm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, DType::bf16, 5, 0, 0));
  EXPECT_NO_THROW(cuda::softmax_forward(nullptr, nullptr, DType::f32, 0, 3, 0));
  EXPECT_NO_THROW(
      cuda::cross_entropy_forward(nullptr, nullptr, nullptr, DType::f32, nullptr, DType::i32, 0, 3, -1, 0));
  EXPECT_NO_THROW(cuda::gelu_tanh_forward(nullptr, nullptr, DType::f32, 0, 0));
  EXPECT_NO_THROW(cuda::dropout_forward(nullptr, nullptr, DType::f32, 0, 0.5, RngState{}, 0));
  EXPECT_NO_THROW(cuda::embedding_backward(nullptr, nullptr, nullptr, DType::f32, DType::i64, 0, 3, 3, 0));
}

// Without a device, a well-formed call says why.
TEST(CudaNnArguments, NoDeviceIsReported) {
  if (cuda::is_available()) GTEST_SKIP() << "a device is available";
  float fake[4] = {};
  const std::string message = error_of([&] { cuda::gelu_tanh_forward(fake, fake, DType::f32, 4, 0); });
  EXPECT_EQ(message.rfind("cuda::gelu_tanh_forward: ", 0), 0u) << message;
  EXPECT_NE(message.find(cuda::unavailable_reason()), std::string::npos) << message;
}

}  // namespace
}  // namespace memtrain
