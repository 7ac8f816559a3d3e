// Every test of layer_norm and rms_norm (include/memtrain/ops/nn.h; front-end and backward rule in
// src/ops/nn_norm.cpp, CPU kernels in src/cpu/norm.cpp, CUDA kernels and entries in src/cuda/norm.cu):
//   CPU      forward against float64 loops written here, gradients against central finite differences in
//            float64 (gradcheck.h), bad parameters refused naming the op;
//   meta     forward and backward account the same bytes per category as on the CPU;
//   CUDA     the ops end to end through autograd against the same ops on the CPU (normwise, tolerances in
//            cuda_compare.h), and the backend's entries against the CPU's entries element by element on fresh
//            random inputs (tolerances and why beside each check), deterministic parameter gradients, and what
//            the CUDA side refuses.
// Outputs of the CUDA entries are NaN-filled before each call, so an element a kernel never writes fails.
// bf16 inputs are bf16 values and the CPU reference runs in f32 on exactly those values, so the only bf16 error
// is the final rounding (half an ulp, 2^-9 relative) plus f32 rounding differences. CUDA tests build
// everywhere (they reach CUDA through the backend contract) and skip without a usable device.
#include "cuda_compare.h"
#include "gradcheck.h"
#include "meta_footprint.h"
#include "op_test_util.h"

#include "core/backend.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/nn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::normal;
using testing::values_of;
using test_support::compare_with_cpu;
using test_support::expect_close;
using test_support::expect_same_bits;
using test_support::expect_same_footprint;
using test_support::from_floats;
using test_support::kCuda;
using test_support::kDtypes;
using test_support::name_of;
using test_support::OpFn;
using test_support::random_normal;
using test_support::random_uniform;
using test_support::random_values;
using test_support::round_bf16;
using test_support::Shape2;
using test_support::Tol;
using test_support::tol_for;
using test_support::tolerance;
using test_support::Tolerance;

Tensor int_tensor(const std::vector<std::int64_t>& v) {
  return from_buffer(v.data(), {static_cast<std::int64_t>(v.size())}, DType::i64, DType::i64);
}

// ---- CPU: float64 references and finite differences --------------------------------------------------

TEST(NnOpsNorm, LayerNormForwardMatchesNaive) {
  const std::int64_t N = 6, C = 10;
  const Tensor x = normal({2, 3, C}, 3), w = normal({C}, 4), b = normal({C}, 5);
  const std::vector<double> xv = values_of(x), wv = values_of(w), bv = values_of(b);
  std::vector<double> ref(xv.size()), ref_plain(xv.size());
  for (std::int64_t n = 0; n < N; ++n) {
    double m = 0, var = 0;
    for (std::int64_t c = 0; c < C; ++c) m += xv[n * C + c] / C;
    for (std::int64_t c = 0; c < C; ++c) var += (xv[n * C + c] - m) * (xv[n * C + c] - m) / C;
    for (std::int64_t c = 0; c < C; ++c) {
      const double norm = (xv[n * C + c] - m) / std::sqrt(var + 1e-5);
      ref[n * C + c] = norm * wv[c] + bv[c];
      ref_plain[n * C + c] = norm;
    }
  }
  expect_close(values_of(ops::layer_norm(x, w, b)), ref, 1e-12, 1e-12, "layer_norm f64");
  expect_close(values_of(ops::layer_norm(x, Tensor(), Tensor())), ref_plain, 1e-12, 1e-12, "no affine");
  const Tensor y32 = ops::layer_norm(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32));
  expect_close(values_of(y32), ref, 1e-5, 1e-5, "layer_norm f32");
  // bf16 activations with f32 parameters: result in bf16, within bf16 rounding of the exact value.
  const Tensor ybf = ops::layer_norm(x.to(DType::bf16), w.to(DType::f32), b.to(DType::f32));
  EXPECT_EQ(ybf.dtype(), DType::bf16);
  const std::vector<double> ref_from_bf16 = values_of(ops::layer_norm(x.to(DType::bf16).to(DType::f64), w, b));
  expect_close(values_of(ybf), ref_from_bf16, 1.0 / 128, 1e-2, "layer_norm bf16");
}

TEST(NnOpsNorm, RmsNormForwardMatchesNaive) {
  const std::int64_t N = 4, C = 7;
  const Tensor x = normal({N, C}, 6), w = normal({C}, 7);
  const std::vector<double> xv = values_of(x), wv = values_of(w);
  std::vector<double> ref(xv.size());
  for (std::int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (std::int64_t c = 0; c < C; ++c) ss += xv[n * C + c] * xv[n * C + c] / C;
    for (std::int64_t c = 0; c < C; ++c) ref[n * C + c] = xv[n * C + c] / std::sqrt(ss + 1e-6) * wv[c];
  }
  expect_close(values_of(ops::rms_norm(x, w)), ref, 1e-12, 1e-12, "rms_norm f64");
  expect_close(values_of(ops::rms_norm(x.to(DType::f32), w.to(DType::f32))), ref, 1e-5, 1e-5, "rms_norm f32");
}

TEST(NnOpsNorm, GradientsMatchFiniteDifferences) {
  const Tensor x = normal({3, 2, 5}, 8).set_requires_grad(true);
  const Tensor w = normal({5}, 9).set_requires_grad(true), b = normal({5}, 10).set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], in[2]); },
                         {x, w, b});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], Tensor(), Tensor()); },
                         {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1]); }, {x, w});
  // Weight frozen: only x gets a gradient.
  expect_gradients_match([w](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], w.detach(), Tensor()); },
                         {x});
}

TEST(NnOpsNorm, RejectsMismatchedParameters) {
  const Tensor x = normal({2, 4}, 11, DType::f32);
  expect_error([&] { ops::layer_norm(x, ones({5}), Tensor()); }, {"layer_norm", "[5]", "[2, 4]"});
  expect_error([&] { ops::rms_norm(x, ones({4}, DType::f64)); }, {"rms_norm", "f64"});
  expect_error([&] { ops::layer_norm(int_tensor({1, 2}), Tensor(), Tensor()); }, {"layer_norm", "i64"});
}

// ---- meta: the CPU's bytes ----------------------------------------------------------------------------

TEST(MetaDevice, NormsMatchCpuBytesForwardAndBackward) {
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const bool affine : {true, false}) {
      const std::string what = std::string(dtype_name(dtype)) + std::string(affine ? " affine" : " plain");
      const DType param_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;  // f32 params with narrow x
      expect_same_footprint("layer_norm " + what, [&](Device dev) {
        Tensor w, b;
        {
          CategoryGuard params(MemoryCategory::parameters);
          if (affine) {
            w = randn({48}, param_dtype, dev).set_requires_grad(true);
            b = randn({48}, param_dtype, dev).set_requires_grad(true);
          }
        }
        CategoryGuard acts(MemoryCategory::activations);
        // 3 x 4000 x 48 bf16 takes the slab path (more than one slab of 2^19 elements).
        Tensor x = randn({3, 4000, 48}, dtype, dev).set_requires_grad(true);
        const Tensor y = ops::layer_norm(x, w, b);
        {
          CategoryGuard grads(MemoryCategory::gradients);
          y.backward(ones(y.shape(), y.dtype(), dev));
        }
        EXPECT_TRUE(x.grad().defined());
        if (affine) EXPECT_EQ(w.grad().dtype(), param_dtype);
      });
      expect_same_footprint("rms_norm " + what, [&](Device dev) {
        Tensor w;
        {
          CategoryGuard params(MemoryCategory::parameters);
          if (affine) w = randn({48}, dtype, dev).set_requires_grad(true);
        }
        CategoryGuard acts(MemoryCategory::activations);
        Tensor x = randn({2, 33, 48}, dtype, dev).set_requires_grad(true);
        const Tensor y = ops::rms_norm(x.t().t(), w);
        CategoryGuard grads(MemoryCategory::gradients);
        y.backward(ones(y.shape(), y.dtype(), dev));
        EXPECT_EQ(x.grad().dtype(), dtype);
      });
    }
  }
}

// ---- CUDA: the ops against the CPU, end to end through autograd ----------------------------------------

const std::vector<Shape> kOpShapes = {{1, 1}, {3, 5}, {127, 33}, {2, 64, 768}, {4097, 3}, {7}};

TEST(CudaOpsNorm, LayerNormMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 100;
  for (DType dtype : kDtypes) {
    for (const Shape& shape : kOpShapes) {
      const std::int64_t C = shape.back();
      const Tensor x = random_normal(shape, dtype, ++seed, 2.0f, 0.5f);
      const Tensor w = random_uniform({C}, dtype, ++seed, 0.5f, 1.5f);
      const Tensor b = random_uniform({C}, dtype, ++seed, -0.5f, 0.5f);
      const OpFn f = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], in[2], 1e-5); };
      compare_with_cpu("layer_norm affine " + name_of(dtype, shape), {x, w, b}, {true, true, true}, f,
                       tolerance(dtype), seed);
      compare_with_cpu("layer_norm weight only " + name_of(dtype, shape), {x, w, Tensor()}, {true, true, false}, f,
                       tolerance(dtype), seed);
      compare_with_cpu("layer_norm no affine " + name_of(dtype, shape), {x, Tensor(), Tensor()},
                       {true, false, false}, f, tolerance(dtype), seed);
      // Parameters that need no gradient: the kernel skips dweight/dbias.
      compare_with_cpu("layer_norm frozen affine " + name_of(dtype, shape), {x, w, b}, {true, false, false}, f,
                       tolerance(dtype), seed);
    }
  }
}

TEST(CudaOpsNorm, RmsNormMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 200;
  for (DType dtype : kDtypes) {
    for (const Shape& shape : kOpShapes) {
      const std::int64_t C = shape.back();
      const Tensor x = random_normal(shape, dtype, ++seed, 2.0f, 0.5f);
      const Tensor w = random_uniform({C}, dtype, ++seed, 0.5f, 1.5f);
      const OpFn f = [](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1], 1e-6); };
      // With C = 1, dx = w rstd (1 - x^2 rstd^2) ~ w eps / |x|^3 is a cancellation: both sides are accurate
      // only relative to the terms w * rstd * dout (~0.5 here), so the gradient error is measured against that.
      Tolerance tol = tolerance(dtype);
      tol.grad_floor = 0.5;
      compare_with_cpu("rms_norm " + name_of(dtype, shape), {x, w}, {true, true}, f, tol, seed);
      compare_with_cpu("rms_norm no weight " + name_of(dtype, shape), {x, Tensor()}, {true, false}, f, tol, seed);
    }
  }
}

// ---- CUDA: the backend's entries against the CPU's ----------------------------------------------------

const ::memtrain::detail::Backend& cuda_backend() { return ::memtrain::detail::backend_for(kCuda); }

// v (values of dtype, see random_values) as a cuda:0 tensor.
Tensor on_device(const std::vector<float>& v, const Shape& shape, DType dtype) {
  return from_floats(v, shape, dtype).to(kCuda);
}

// An output on cuda:0, NaN until a kernel writes it.
Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, kCuda);
  t.fill_(std::nan(""));
  return t;
}

// The reference the CUDA entries are held to: the CPU backend's same entries, in f32.
const ::memtrain::detail::Backend& cpu_reference() { return ::memtrain::detail::backend_for(Device::cpu()); }
Tensor on_host(const std::vector<float>& v, const Shape& shape) { return from_floats(v, shape, DType::f32); }
Tensor host_output(const Shape& shape) { return Tensor::empty(shape, DType::f32, Device::cpu()); }

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).to(DType::f32).contiguous();
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

// f32: the bits; bf16 and f16: the 16 bits, widened.
std::vector<std::uint32_t> raw_bits(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<std::uint32_t> out(static_cast<std::size_t>(h.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (h.dtype() == DType::f32) {
      std::memcpy(&out[i], static_cast<const char*>(h.data_ptr()) + 4 * i, 4);
    } else {
      std::uint16_t bits;
      std::memcpy(&bits, static_cast<const char*>(h.data_ptr()) + 2 * i, 2);
      out[i] = bits;
    }
  }
  return out;
}

// Row shapes: single elements, odd sizes, the model widths (768..4096), and more rows than the row
// kernels' grid (65535 blocks) so the row loop wraps.
const Shape2 kRowShapes[] = {{1, 1}, {3, 3}, {127, 127}, {5, 768}, {64, 1000}, {7, 4097}, {33, 4096}, {70000, 3}};

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

  // CPU reference: the CPU backend's entries in f32 on the same values (dweight and dbias asked for even
  // without the affine parameters, as the CUDA entries are below).
  const Tensor hx = on_host(x, {N, C});
  const Tensor hw = affine ? on_host(w, {C}) : Tensor(), hb = affine ? on_host(b, {C}) : Tensor();
  const Tensor hy = host_output({N, C}), hmean = host_output({N}), hrstd = host_output({N});
  cpu_reference().layer_norm_forward(hy, hmean, hrstd, hx, hw, hb, eps);
  const Tensor hdx = host_output({N, C}), hdw = host_output({C}), hdb = host_output({C});
  cpu_reference().layer_norm_backward(hdx, hdw, hdb, on_host(dout, {N, C}), hx, hw, hmean, hrstd);
  const std::vector<float> out_ref = host_floats(hy), mean_ref = host_floats(hmean), rstd_ref = host_floats(hrstd);
  const std::vector<float> dx_ref = host_floats(hdx), dw_ref = host_floats(hdw), db_ref = host_floats(hdb);

  const Tensor dx_in = on_device(x, {N, C}, dtype);
  const Tensor dw = affine ? on_device(w, {C}, dtype) : Tensor(), db = affine ? on_device(b, {C}, dtype) : Tensor();
  const Tensor dy = poisoned({N, C}, dtype), dmean = poisoned({N}, DType::f32), drstd = poisoned({N}, DType::f32);
  cuda_backend().layer_norm_forward(dy, dmean, drstd, dx_in, dw, db, eps);
  // The GPU's mean is an f32 sum (the CPU's a double one): a few ulps of |x| <= 3, which enter out times
  // rstd * |weight| (rows of three close values have a large rstd).
  std::vector<double> extra(nc);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) extra[n * C + c] = 2e-6 * rstd_ref[n] * (affine ? std::abs(w[c]) : 1.0);
  expect_close(host_floats(dy), out_ref, tol_for(dtype), "out", &extra);
  // mean: f32 sums of up to 4097 values of |x| < 3 (error ~1e-6 at worst); rstd: relative.
  expect_close(host_floats(dmean), mean_ref, Tol{1e-5, 1e-5}, "mean");
  expect_close(host_floats(drstd), rstd_ref, Tol{1e-5, 0}, "rstd");

  // Backward from the CPU's statistics, so it is compared on identical inputs.
  const Tensor dout_dev = on_device(dout, {N, C}, dtype);
  const Tensor mean_in = on_device(mean_ref, {N}, DType::f32), rstd_in = on_device(rstd_ref, {N}, DType::f32);
  const Tensor ddx = poisoned({N, C}, dtype), ddw = poisoned({C}, dtype), ddb = poisoned({C}, dtype);
  cuda_backend().layer_norm_backward(ddx, ddw, ddb, dout_dev, dx_in, dw, mean_in, rstd_in);
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
  expect_close(host_floats(ddx), dx_ref, tol_for(dtype), "dx", &dx_extra);
  const auto dw_scale = abs_column_sums(N, C, [&](auto n, auto c) { return dout[n * C + c] * norm(n, c); });
  const auto db_scale = abs_column_sums(N, C, [&](auto n, auto c) { return dout[n * C + c]; });
  expect_column_sums(host_floats(ddw), dw_ref, dw_scale, dtype, "dweight");
  expect_column_sums(host_floats(ddb), db_ref, db_scale, dtype, "dbias");
  // dx alone (no parameter gradients) is the same.
  const Tensor ddx2 = poisoned({N, C}, dtype);
  cuda_backend().layer_norm_backward(ddx2, Tensor(), Tensor(), dout_dev, dx_in, dw, mean_in, rstd_in);
  expect_same_bits(raw_bits(ddx2), raw_bits(ddx), "dx without dweight/dbias");
}

TEST(CudaNorm, LayerNormMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Shape2 s : kRowShapes) {
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
  const Tensor hx = on_host(x, {N, C}), hw = affine ? on_host(w, {C}) : Tensor();
  const Tensor hy = host_output({N, C}), hrstd = host_output({N}), hdx = host_output({N, C}), hdw = host_output({C});
  cpu_reference().rms_norm_forward(hy, hrstd, hx, hw, eps);
  cpu_reference().rms_norm_backward(hdx, hdw, on_host(dout, {N, C}), hx, hw, hrstd);
  const std::vector<float> out_ref = host_floats(hy), rstd_ref = host_floats(hrstd);
  const std::vector<float> dx_ref = host_floats(hdx), dw_ref = host_floats(hdw);

  const Tensor dx_in = on_device(x, {N, C}, dtype), dw = affine ? on_device(w, {C}, dtype) : Tensor();
  const Tensor dy = poisoned({N, C}, dtype), drstd = poisoned({N}, DType::f32);
  cuda_backend().rms_norm_forward(dy, drstd, dx_in, dw, eps);
  expect_close(host_floats(dy), out_ref, tol_for(dtype), "out");
  expect_close(host_floats(drstd), rstd_ref, Tol{1e-5, 0}, "rstd");

  const Tensor dout_dev = on_device(dout, {N, C}, dtype), rstd_in = on_device(rstd_ref, {N}, DType::f32);
  const Tensor ddx = poisoned({N, C}, dtype), ddw = poisoned({C}, dtype);
  cuda_backend().rms_norm_backward(ddx, ddw, dout_dev, dx_in, dw, rstd_in);
  expect_close(host_floats(ddx), dx_ref, tol_for(dtype), "dx");
  const auto dw_scale =
      abs_column_sums(N, C, [&](auto n, auto c) { return dout[n * C + c] * x[n * C + c] * rstd_ref[n]; });
  expect_column_sums(host_floats(ddw), dw_ref, dw_scale, dtype, "dweight");
}

TEST(CudaNorm, RmsNormMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Shape2 s : kRowShapes) {
      if (dtype == DType::bf16 && s.rows > 10000) continue;
      check_rms_norm(dtype, s, true);
    }
    check_rms_norm(dtype, {127, 127}, false);
  }
}

// dweight/dbias come from fixed-order partial sums: two runs give the same bits.
TEST(CudaNorm, BackwardIsDeterministic) {
  SKIP_WITHOUT_DEVICE();
  constexpr std::int64_t N = 4096, C = 768;
  const std::size_t nc = N * C;
  const Tensor x = on_device(random_values(DType::f32, nc, -2.f, 2.f, 11), {N, C}, DType::f32);
  const Tensor dout = on_device(random_values(DType::f32, nc, -1.f, 1.f, 12), {N, C}, DType::f32);
  const Tensor w = on_device(random_values(DType::f32, C, 0.5f, 1.5f, 13), {C}, DType::f32);
  const Tensor y = poisoned({N, C}, DType::f32), mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
  cuda_backend().layer_norm_forward(y, mean, rstd, x, w, Tensor(), 1e-5);
  std::vector<std::uint32_t> first_dw, first_db, first_rms;
  for (int run = 0; run < 2; ++run) {
    const Tensor dx = poisoned({N, C}, DType::f32), dw = poisoned({C}, DType::f32), db = poisoned({C}, DType::f32);
    const Tensor rdw = poisoned({C}, DType::f32);
    cuda_backend().layer_norm_backward(dx, dw, db, dout, x, w, mean, rstd);
    cuda_backend().rms_norm_backward(dx, rdw, dout, x, w, rstd);
    if (run == 0) {
      first_dw = raw_bits(dw);
      first_db = raw_bits(db);
      first_rms = raw_bits(rdw);
    } else {
      expect_same_bits(raw_bits(dw), first_dw, "layer_norm dweight");
      expect_same_bits(raw_bits(db), first_db, "layer_norm dbias");
      expect_same_bits(raw_bits(rdw), first_rms, "rms_norm dweight");
    }
  }
}

// ---- CUDA: what the CUDA side refuses, with a message naming the op ----------------------------------------

TEST(CudaOpsNorm, UnsupportedCasesThrowClearly) {
  SKIP_WITHOUT_DEVICE();
  const Tensor x = random_normal({4, 6}, DType::f32, 1000).to(kCuda);
  const Tensor w = random_uniform({6}, DType::f32, 1001, 0.5f, 1.5f);

  // A dtype the kernels do not take.
  const Tensor x64 = random_normal({4, 6}, DType::f64, 1002).to(kCuda);
  expect_error([&] { ops::layer_norm(x64, Tensor(), Tensor()); },
               {"layer_norm: ", "dtype f64 on cuda:0 is not supported yet"});
  // One dtype for x and the affine parameters.
  const Tensor xb = x.detach().to(Device::cpu()).to(DType::bf16).to(kCuda);
  expect_error([&] { ops::layer_norm(xb, w.to(kCuda), Tensor()); },
               {"layer_norm: ", "weight f32", "input bf16", "on cuda:0 is not supported yet"});
  expect_error([&] { ops::rms_norm(xb, w.to(kCuda)); }, {"rms_norm: ", "on cuda:0 is not supported yet"});

  // A non-contiguous input (no strided copy on the device yet).
  expect_error([&] { ops::layer_norm(x.t(), Tensor(), Tensor()); },
               {"layer_norm: ", "non-contiguous input on cuda:0 is not supported yet"});

  // A non-contiguous output gradient reaching a CUDA backward.
  {
    Tensor leaf = x.detach();
    leaf.set_requires_grad(true);
    const Tensor y = ops::layer_norm(leaf, Tensor(), Tensor());
    expect_error([&] { y.backward(full({}, 1.0, DType::f32, kCuda).expand({4, 6})); },
                 {"layer_norm_backward: ", "non-contiguous output gradient on cuda:0 is not supported yet"});
  }

  // Mixed devices.
  expect_error([&] { ops::layer_norm(x, w, Tensor()); }, {"layer_norm: ", "cuda:0", "cpu", "one device"});
  expect_error([&] { ops::rms_norm(x.to(Device::cpu()), w.to(kCuda)); }, {"rms_norm: ", "one device"});
}

// The entries' own checks, for callers other than the front-ends (which refuse these cases first).
TEST(CudaNorm, BadArgumentsThrowNamingTheOp) {
  SKIP_WITHOUT_DEVICE();
  const Tensor x64 = Tensor::empty({2, 2}, DType::f64, kCuda), x = poisoned({2, 2}, DType::f32);
  const Tensor stats = poisoned({2}, DType::f32);
  expect_error([&] { cuda_backend().layer_norm_forward(x64, stats, stats, x64, Tensor(), Tensor(), 1e-5); },
               {"layer_norm: ", "dtype f64"});
  expect_error([&] { cuda_backend().layer_norm_forward(x, stats, stats, x, Tensor(), Tensor(), NAN); },
               {"layer_norm: ", "eps="});
  const Tensor x0 = Tensor::empty({2, 0}, DType::f32, kCuda);
  expect_error([&] { cuda_backend().layer_norm_forward(x0, stats, stats, x0, Tensor(), Tensor(), 1e-5); },
               {"layer_norm: ", "C is 0"});
  expect_error([&] { cuda_backend().rms_norm_forward(x64, stats, x64, Tensor(), 1e-5); }, {"rms_norm: ", "dtype f64"});
}

// No rows, or rows of no columns: nothing is launched.
TEST(CudaNorm, EmptyInputsDoNothing) {
  SKIP_WITHOUT_DEVICE();
  const Tensor rows0 = Tensor::empty({0, 8}, DType::f32, kCuda), stats0 = Tensor::empty({0}, DType::f32, kCuda);
  EXPECT_NO_THROW(cuda_backend().layer_norm_forward(rows0, stats0, stats0, rows0, Tensor(), Tensor(), 1e-5));
  const Tensor cols0 = Tensor::empty({5, 0}, DType::bf16, kCuda), stats5 = Tensor::empty({5}, DType::f32, kCuda);
  EXPECT_NO_THROW(cuda_backend().rms_norm_backward(cols0, Tensor(), cols0, cols0, Tensor(), stats5));
}

}  // namespace
}  // namespace memtrain
