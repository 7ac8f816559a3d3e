// CUDA neural-net kernels (src/cuda/nn.h) against the CPU kernels of src/cpu/ on fresh random inputs:
// softmax/log-softmax, cross entropy, GELU, dropout, embedding; f32 and bf16, odd shapes (layer/RMS norm:
// tests/test_norm.cpp). Helpers shared with the other CUDA tests: tests/cuda_compare.h.
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
#include "cpu/softmax.h"

#include "cuda_compare.h"
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

using test_support::bf16_bits;
using test_support::bf16_value;
using test_support::DeviceBuffer;
using test_support::download;
using test_support::expect_close;
using test_support::expect_same_bits;
using test_support::random_values;
using test_support::round_bf16;
using test_support::Shape2;
using test_support::Tol;
using test_support::tol_for;
using test_support::upload;

// ---- device buffers ----

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

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
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
