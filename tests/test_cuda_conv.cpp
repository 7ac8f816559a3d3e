// CUDA conv2d, pooling and batch norm (src/cuda/conv.h, src/cuda/nn_spatial.h) against the CPU on
// fresh random inputs of several shapes, f32, bf16 and f16. Outputs are poisoned (0xFF bytes: NaN) before each
// call, so an unwritten element fails.
// References: conv2d runs cpu::conv2d_forward/backward<double>; pooling runs cpu::*_pool2d<float> on the same
// values; batch norm runs nn::BatchNorm2d in f64 on the CPU with autograd for the gradients.
// Tolerances: |got - want| <= rtol * mag + atol, mag = the same computation on absolute values (for a sum, the
// sum of |terms|), which bounds the rounding error of any summation order. f32: rtol 1e-5 (f32 sums of up to a
// few hundred terms); bf16 and f16: rtol 1e-2 (inputs are bf16 / f16 values, so the error is the final rounding,
// 2^-9 or 2^-12, plus f32 or tensor-core accumulation).
// Conv runs both implementations on the device: the im2col fallback (ConvImpl::im2col) and, when the build has
// cuDNN, cuDNN. Device tests skip without a usable device; argument checks run everywhere.
#include "cuda/conv.h"
#include "cuda/nn_spatial.h"

#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/nn/batch_norm.h"

#include "cpu/conv.h"
#include "cpu/pool.h"

#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using test_support::DeviceBuffer;
using test_support::download;
using test_support::upload;

std::uint16_t bf16_bits(float f) {  // round to nearest even
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }
// The 16 bits of f in a narrow dtype (bf16 or f16), and back.
std::uint16_t narrow_bits(DType dtype, float f) {
  return dtype == DType::bf16 ? bf16_bits(f) : Half::from_float(f).bits;
}
float narrow_value(DType dtype, std::uint16_t bits) {
  return dtype == DType::bf16 ? bf16_value(bits) : Half::from_bits(bits).to_float();
}
float round_to(DType dtype, float f) { return dtype == DType::f32 ? f : narrow_value(dtype, narrow_bits(dtype, f)); }
std::string dtype_suffix(DType dtype) { return " " + std::string(dtype_name(dtype)); }
constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

// n elements of dtype (f32, bf16 or f16) on cuda:0, 0xFF bytes (NaN) until set.
class DeviceArray {
 public:
  DeviceArray(DType dtype, std::size_t n) : dtype_(dtype), n_(n), buf_(n * dtype_size(dtype)) {
    upload(buf_.get(), std::vector<std::uint8_t>(n_ * dtype_size(dtype_), 0xff));
  }
  void set(const std::vector<float>& v) {
    if (dtype_ == DType::f32) {
      upload(buf_.get(), v);
    } else {
      std::vector<std::uint16_t> bits(n_);
      for (std::size_t i = 0; i < n_; ++i) bits[i] = narrow_bits(dtype_, v[i]);
      upload(buf_.get(), bits);
    }
  }
  std::vector<float> get() const {
    if (dtype_ == DType::f32) return download<float>(buf_.get(), n_);
    const auto bits = download<std::uint16_t>(buf_.get(), n_);
    std::vector<float> v(n_);
    for (std::size_t i = 0; i < n_; ++i) v[i] = narrow_value(dtype_, bits[i]);
    return v;
  }
  void* ptr() const { return buf_.get(); }

 private:
  DType dtype_;
  std::size_t n_;
  DeviceBuffer buf_;
};

std::vector<float> random_values(DType dtype, std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to(dtype, dist(rng));
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
std::vector<double> abs_of(const std::vector<double>& v) {
  std::vector<double> a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::abs(v[i]);
  return a;
}

// |got - want| <= rtol * mag + atol elementwise (NaN fails); reports the count and the worst element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& mag,
                  double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, worst_i = 0;
  double worst = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double ratio = std::isnan(err) ? INFINITY : err / (rtol * mag[i] + atol);
    if (ratio > 1.0) ++bad;
    if (ratio > worst) {
      worst = ratio;
      worst_i = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; worst at " << worst_i
                     << ": got " << got[worst_i] << ", want " << want[worst_i] << " (mag " << mag[worst_i] << ")";
}

double rtol_for(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-2; }

// ---- conv2d ----

struct ConvCase {
  std::int64_t B, Cin, H, W, Cout, KH, KW, stride, padding, groups;
  bool bias;
};

cuda::Conv2dShape make_shape(const ConvCase& c) {
  cuda::Conv2dShape s{c.B, c.Cin, c.H, c.W, c.Cout, c.KH, c.KW, c.stride, c.padding, c.groups, 0, 0};
  s.OH = cpu::conv_out_size(c.H, c.KH, c.stride, c.padding);
  s.OW = cpu::conv_out_size(c.W, c.KW, c.stride, c.padding);
  return s;
}
cpu::Conv2dShape cpu_shape(const cuda::Conv2dShape& s) {
  return {s.B, s.Cin, s.H, s.W, s.Cout, s.KH, s.KW, s.stride, s.padding, s.groups, s.OH, s.OW};
}

struct ConvRef {
  std::vector<double> y, dx, dw, db;
};
ConvRef conv_reference(const cuda::Conv2dShape& s, const std::vector<double>& x, const std::vector<double>& w,
                       const std::vector<double>* b, const std::vector<double>& dout) {
  const cpu::Conv2dShape cs = cpu_shape(s);
  ConvRef r;
  r.y.resize(static_cast<std::size_t>(s.B * s.Cout * s.OH * s.OW));
  r.dx.resize(x.size());
  r.dw.resize(w.size());
  r.db.resize(static_cast<std::size_t>(s.Cout));
  std::vector<double> ws(static_cast<std::size_t>(
      std::max<std::int64_t>({cpu::conv2d_forward_workspace(cs, 1), cpu::conv2d_backward_workspace(cs, 1), 1})));
  cpu::conv2d_forward<double>(r.y.data(), x.data(), w.data(), b != nullptr ? b->data() : nullptr, cs, ws.data(), 1);
  cpu::conv2d_backward<double>(r.dx.data(), r.dw.data(), r.db.data(), dout.data(), x.data(), w.data(), cs, ws.data(),
                               1);
  return r;
}

const ConvCase kConvCases[] = {
    {2, 3, 7, 9, 4, 3, 3, 1, 1, 1, true},     // 3x3, padding 1
    {3, 4, 8, 8, 6, 3, 3, 2, 1, 1, false},    // stride 2
    {2, 8, 5, 6, 6, 1, 1, 1, 0, 1, true},     // 1x1
    {1, 5, 11, 13, 7, 5, 3, 2, 2, 1, true},   // odd sizes, non-square kernel
    {2, 6, 7, 7, 4, 3, 3, 1, 1, 2, true},     // groups
    {2, 4, 6, 6, 4, 3, 3, 1, 1, 4, false},    // depthwise
    {2, 8, 9, 9, 8, 3, 3, 1, 1, 8, true},     // depthwise 3x3 s1 p1 (the CPU reference takes its direct loops)
    {2, 6, 11, 13, 6, 5, 5, 2, 2, 6, false},  // depthwise 5x5 s2 p2
    {2, 4, 7, 9, 8, 3, 3, 1, 1, 4, true},     // depthwise, channel multiplier 2
    {1, 2, 5, 5, 3, 3, 3, 1, 2, 1, true},     // padding past kernel / 2: all-padding rows in the output
    {2, 3, 4, 4, 5, 4, 4, 1, 0, 1, true},     // kernel as large as the input: 1x1 output
};

void run_conv_case(const ConvCase& c, DType dtype, cuda::ConvImpl impl) {
  const cuda::Conv2dShape s = make_shape(c);
  const std::string what = "conv B=" + std::to_string(c.B) + " Cin=" + std::to_string(c.Cin) + " " +
                           std::to_string(c.H) + "x" + std::to_string(c.W) + " Cout=" + std::to_string(c.Cout) +
                           " k=" + std::to_string(c.KH) + "x" + std::to_string(c.KW) + " s=" +
                           std::to_string(c.stride) + " p=" + std::to_string(c.padding) + " g=" +
                           std::to_string(c.groups) + dtype_suffix(dtype) +
                           (impl == cuda::ConvImpl::im2col ? " im2col" : " auto");
  const auto nx = static_cast<std::size_t>(s.B * s.Cin * s.H * s.W);
  const auto nw = static_cast<std::size_t>(s.Cout * (s.Cin / s.groups) * s.KH * s.KW);
  const auto ny = static_cast<std::size_t>(s.B * s.Cout * s.OH * s.OW);
  const auto nb = static_cast<std::size_t>(s.Cout);
  const std::uint64_t seed = static_cast<std::uint64_t>(c.Cin * 1000 + c.H * 10 + c.stride);
  const auto x = random_values(dtype, nx, -1, 1, seed), w = random_values(dtype, nw, -1, 1, seed + 1);
  const auto b = random_values(dtype, nb, -1, 1, seed + 2), dout = random_values(dtype, ny, -1, 1, seed + 3);
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), gd = to_double(dout);
  const ConvRef ref = conv_reference(s, xd, wd, c.bias ? &bd : nullptr, gd);
  const auto abs_b = abs_of(bd);
  const ConvRef mag = conv_reference(s, abs_of(xd), abs_of(wd), c.bias ? &abs_b : nullptr, abs_of(gd));

  DeviceArray dx_in(dtype, nx), dw_in(dtype, nw), db_in(dtype, nb), dg(dtype, ny);
  dx_in.set(x);
  dw_in.set(w);
  db_in.set(b);
  dg.set(dout);
  DeviceArray y(dtype, ny), dx(dtype, nx), dw(dtype, nw), db(dtype, nb);
  cuda::conv2d_forward(y.ptr(), dx_in.ptr(), dw_in.ptr(), c.bias ? db_in.ptr() : nullptr, dtype, s, 0, impl);
  cuda::conv2d_backward(dx.ptr(), dw.ptr(), db.ptr(), dg.ptr(), dx_in.ptr(), dw_in.ptr(), dtype, s, 0, impl);
  const double rtol = rtol_for(dtype), atol = 1e-6;
  expect_close(y.get(), ref.y, mag.y, rtol, atol, what + " y");
  expect_close(dx.get(), ref.dx, mag.dx, rtol, atol, what + " dx");
  expect_close(dw.get(), ref.dw, mag.dw, rtol, atol, what + " dw");
  expect_close(db.get(), ref.db, mag.db, rtol, atol, what + " db");

  // Deterministic: a second backward gives the same bits.
  DeviceArray dx2(dtype, nx), dw2(dtype, nw);
  cuda::conv2d_backward(dx2.ptr(), dw2.ptr(), nullptr, dg.ptr(), dx_in.ptr(), dw_in.ptr(), dtype, s, 0, impl);
  const auto a = dx.get(), a2 = dx2.get(), g = dw.get(), g2 = dw2.get();
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(a2[i])) << what << " dx rerun at " << i;
  for (std::size_t i = 0; i < g.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(g[i]), std::bit_cast<std::uint32_t>(g2[i])) << what << " dw rerun at " << i;
}

TEST(CudaConv, Im2colFallbackMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const ConvCase& c : kConvCases)
    for (DType dtype : kDtypes) run_conv_case(c, dtype, cuda::ConvImpl::im2col);
}

TEST(CudaConv, DefaultImplementationMatchesCpu) {  // cuDNN when the build has it
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  if (!cuda::conv_cudnn_built()) GTEST_SKIP() << "built without cuDNN: the default is the im2col fallback, tested above";
  for (const ConvCase& c : kConvCases)
    for (DType dtype : kDtypes) run_conv_case(c, dtype, cuda::ConvImpl::cudnn);
}

// Only some gradients wanted: the others stay untouched (poisoned) and no null operand is read.
TEST(CudaConv, PartialBackward) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const cuda::Conv2dShape s = make_shape({2, 3, 6, 6, 4, 3, 3, 1, 1, 1, true});
  const std::size_t nx = 2 * 3 * 36, nw = 4 * 3 * 9, ny = 2 * 4 * 36;
  const auto x = random_values(DType::f32, nx, -1, 1, 5), w = random_values(DType::f32, nw, -1, 1, 6);
  const auto dout = random_values(DType::f32, ny, -1, 1, 7);
  const ConvRef ref = conv_reference(s, to_double(x), to_double(w), nullptr, to_double(dout));
  const ConvRef mag = conv_reference(s, abs_of(to_double(x)), abs_of(to_double(w)), nullptr, abs_of(to_double(dout)));
  for (cuda::ConvImpl impl : {cuda::ConvImpl::im2col, cuda::ConvImpl::automatic}) {
    DeviceArray dxi(DType::f32, nx), dwi(DType::f32, nw), dg(DType::f32, ny), dx(DType::f32, nx), dw(DType::f32, nw);
    dxi.set(x);
    dwi.set(w);
    dg.set(dout);
    cuda::conv2d_backward(dx.ptr(), nullptr, nullptr, dg.ptr(), nullptr, dwi.ptr(), DType::f32, s, 0, impl);
    expect_close(dx.get(), ref.dx, mag.dx, 1e-5, 1e-6, "dx only");
    cuda::conv2d_backward(nullptr, dw.ptr(), nullptr, dg.ptr(), dxi.ptr(), nullptr, DType::f32, s, 0, impl);
    expect_close(dw.get(), ref.dw, mag.dw, 1e-5, 1e-6, "dw only");
  }
}

TEST(CudaConv, RejectsBadArguments) {
  cuda::Conv2dShape s = make_shape({1, 3, 5, 5, 4, 3, 3, 1, 1, 1, false});
  EXPECT_THROW(cuda::conv2d_forward(nullptr, nullptr, nullptr, nullptr, DType::f64, s, 0), Error);  // dtype
  cuda::Conv2dShape bad = s;
  bad.OH = 7;  // does not match the input
  EXPECT_THROW(cuda::conv2d_forward(nullptr, nullptr, nullptr, nullptr, DType::f32, bad, 0), Error);
  bad = s;
  bad.groups = 2;  // Cin = 3 does not divide
  EXPECT_THROW(cuda::conv2d_forward(nullptr, nullptr, nullptr, nullptr, DType::f32, bad, 0), Error);
  try {
    cuda::conv2d_forward(nullptr, nullptr, nullptr, nullptr, DType::f16, s, 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d_forward"), std::string::npos) << e.what();
  }
}

// ---- pooling ----

struct PoolCase {
  std::int64_t planes, H, W, kernel, stride, padding;
};
const PoolCase kPoolCases[] = {
    {6, 7, 9, 2, 2, 0}, {2, 8, 8, 3, 1, 1}, {4, 9, 7, 3, 2, 1}, {1, 5, 5, 4, 3, 2}, {3, 1, 6, 1, 1, 0},
};

cuda::Pool2dShape pool_shape(const PoolCase& c) {
  return {c.planes, c.H, c.W, c.kernel, c.stride, c.padding, (c.H + 2 * c.padding - c.kernel) / c.stride + 1,
          (c.W + 2 * c.padding - c.kernel) / c.stride + 1};
}
cpu::Pool2dShape cpu_pool(const cuda::Pool2dShape& s) {
  return {s.planes, s.H, s.W, s.kernel, s.stride, s.padding, s.OH, s.OW};
}

// x from a few integer levels, so max windows have ties (the first maximum must win, as on the CPU).
void run_pool_case(const PoolCase& c, DType dtype, bool ties) {
  const cuda::Pool2dShape s = pool_shape(c);
  const cpu::Pool2dShape cs = cpu_pool(s);
  const auto nx = static_cast<std::size_t>(s.planes * s.H * s.W), ny = static_cast<std::size_t>(s.planes * s.OH * s.OW);
  std::vector<float> x = random_values(dtype, nx, -2, 2, static_cast<std::uint64_t>(c.H * 31 + c.kernel));
  if (ties)
    for (auto& v : x) v = std::floor(v);
  const auto dout = random_values(dtype, ny, -1, 1, static_cast<std::uint64_t>(c.W * 17 + c.stride));
  std::vector<float> abs_dout(ny);
  for (std::size_t i = 0; i < ny; ++i) abs_dout[i] = std::abs(dout[i]);
  const std::string what = "pool " + std::to_string(c.planes) + "x" + std::to_string(c.H) + "x" + std::to_string(c.W) +
                           " k=" + std::to_string(c.kernel) + " s=" + std::to_string(c.stride) + " p=" +
                           std::to_string(c.padding) + dtype_suffix(dtype);
  const double rtol = rtol_for(dtype);
  DeviceArray dx_in(dtype, nx), dg(dtype, ny);
  dx_in.set(x);
  dg.set(dout);
  for (bool is_max : {true, false}) {
    std::vector<float> y(ny), dx(nx), mag_dx(nx);
    std::vector<float> abs_x(nx);
    for (std::size_t i = 0; i < nx; ++i) abs_x[i] = std::abs(x[i]);
    std::vector<float> mag_y(ny);
    if (is_max) {
      cpu::max_pool2d_forward<float>(y.data(), x.data(), cs);
      cpu::max_pool2d_backward<float>(dx.data(), dout.data(), x.data(), cs);
      cpu::max_pool2d_backward<float>(mag_dx.data(), abs_dout.data(), x.data(), cs);
      for (std::size_t i = 0; i < ny; ++i) mag_y[i] = std::abs(y[i]);
    } else {
      cpu::avg_pool2d_forward<float>(y.data(), x.data(), cs);
      cpu::avg_pool2d_forward<float>(mag_y.data(), abs_x.data(), cs);
      cpu::avg_pool2d_backward<float>(dx.data(), dout.data(), cs);
      cpu::avg_pool2d_backward<float>(mag_dx.data(), abs_dout.data(), cs);
    }
    DeviceArray gy(dtype, ny), gdx(dtype, nx);
    if (is_max) {
      cuda::max_pool2d_forward(gy.ptr(), dx_in.ptr(), dtype, s, 0);
      cuda::max_pool2d_backward(gdx.ptr(), dg.ptr(), dx_in.ptr(), dtype, s, 0);
    } else {
      cuda::avg_pool2d_forward(gy.ptr(), dx_in.ptr(), dtype, s, 0);
      cuda::avg_pool2d_backward(gdx.ptr(), dg.ptr(), dtype, s, 0);
    }
    const std::string kind = is_max ? " max" : " avg";
    const auto got_y = gy.get();
    if (is_max) {  // a max selects an input value: exact
      for (std::size_t i = 0; i < ny; ++i) ASSERT_EQ(got_y[i], y[i]) << what << kind << " y at " << i;
    } else {
      expect_close(got_y, to_double(y), to_double(mag_y), rtol, 1e-7, what + kind + " y");
    }
    // Max backward with ties: a gradient routed to the wrong tied element is off by a whole dout value.
    expect_close(gdx.get(), to_double(dx), to_double(mag_dx), rtol, 1e-7, what + kind + " dx");
  }
}

TEST(CudaPool, MaxAndAvgMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const PoolCase& c : kPoolCases)
    for (DType dtype : kDtypes)
      for (bool ties : {false, true}) run_pool_case(c, dtype, ties);
}

TEST(CudaPool, RejectsBadArguments) {
  cuda::Pool2dShape s = pool_shape({2, 5, 5, 2, 2, 0});
  EXPECT_THROW(cuda::max_pool2d_forward(nullptr, nullptr, DType::f64, s, 0), Error);
  cuda::Pool2dShape bad = s;
  bad.padding = 2;  // > kernel / 2
  EXPECT_THROW(cuda::avg_pool2d_forward(nullptr, nullptr, DType::f32, bad, 0), Error);
  bad = s;
  bad.OW = 3;
  EXPECT_THROW(cuda::max_pool2d_backward(nullptr, nullptr, nullptr, DType::f32, bad, 0), Error);
}

// ---- batch norm ----

std::vector<double> values(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).to(DType::f64).contiguous();
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

void run_batch_norm_case(std::int64_t B, std::int64_t C, std::int64_t H, std::int64_t W, DType dtype, bool training) {
  const double eps = 1e-5, momentum = 0.3;
  const std::int64_t HW = H * W;
  const auto n = static_cast<std::size_t>(B * C * HW), nc = static_cast<std::size_t>(C);
  const std::uint64_t seed = static_cast<std::uint64_t>(B * 100 + C * 10 + HW);
  // x with a channel-dependent offset and scale, so the statistics matter.
  std::vector<float> x = random_values(dtype, n, -1, 1, seed);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<double>((i / static_cast<std::size_t>(HW)) % nc);
    x[i] = round_to(dtype, static_cast<float>(x[i] * (1.0 + c) + 0.5 * c));
  }
  const auto w = random_values(dtype, nc, 0.5, 1.5, seed + 1), b = random_values(dtype, nc, -1, 1, seed + 2);
  const auto rm = random_values(dtype, nc, -0.5, 0.5, seed + 3), rv = random_values(dtype, nc, 0.5, 2, seed + 4);
  const auto dout = random_values(dtype, n, -1, 1, seed + 5);

  // CPU reference: the module in f64, gradients by autograd.
  nn::BatchNorm2d bn(C, eps, momentum, DType::f64);
  bn.load_state_dict({{"weight", tensor(to_double(w), {C})},
                      {"bias", tensor(to_double(b), {C})},
                      {"running_mean", tensor(to_double(rm), {C})},
                      {"running_var", tensor(to_double(rv), {C})},
                      {"num_batches_tracked", tensor<std::int64_t>({0}, {})}});
  bn.train(training);
  Tensor xt = tensor(to_double(x), {B, C, H, W});
  xt.set_requires_grad(true);
  const Tensor yt = bn.forward(xt);
  yt.backward(tensor(to_double(dout), {B, C, H, W}));
  const auto ry = values(yt), rdx = values(xt.grad()), rdw = values(bn.weight().grad()), rdb = values(bn.bias().grad());
  const auto rrm = values(bn.running_mean()), rrv = values(bn.running_var());

  DeviceArray gx(dtype, n), gw(dtype, nc), gb(dtype, nc), grm(dtype, nc), grv(dtype, nc), gg(dtype, n);
  gx.set(x);
  gw.set(w);
  gb.set(b);
  grm.set(rm);
  grv.set(rv);
  gg.set(dout);
  DeviceArray gy(dtype, n), gdx(dtype, n), gdw(dtype, nc), gdb(dtype, nc);
  DeviceArray mean(DType::f32, nc), invstd(DType::f32, nc);
  cuda::batch_norm_forward(gy.ptr(), static_cast<float*>(mean.ptr()), static_cast<float*>(invstd.ptr()), grm.ptr(),
                           grv.ptr(), gx.ptr(), gw.ptr(), gb.ptr(), dtype, B, C, HW, training, momentum, eps, 0);
  cuda::batch_norm_backward(gdx.ptr(), gdw.ptr(), gdb.ptr(), gg.ptr(), gx.ptr(), gw.ptr(),
                            static_cast<const float*>(mean.ptr()), static_cast<const float*>(invstd.ptr()), dtype, B, C,
                            HW, training, 0);

  const std::string what = "batch_norm B=" + std::to_string(B) + " C=" + std::to_string(C) + " " + std::to_string(H) +
                           "x" + std::to_string(W) + dtype_suffix(dtype) +
                           (training ? " train" : " eval");
  // Outputs are O(1) after normalisation and sums are over n / C terms of O(1): scale the bound by the sum of
  // |terms| for the sums (dw, db) and by a few units for the elementwise outputs (which also carry the
  // statistics' rounding, amplified by invstd * w, both O(1) here).
  const double rtol = rtol_for(dtype) * 4;
  std::vector<double> mag_sum(nc, 0.0);
  for (std::size_t i = 0; i < n; ++i) mag_sum[(i / static_cast<std::size_t>(HW)) % nc] += std::abs(dout[i]) * 4.0;
  expect_close(gy.get(), ry, abs_of(ry), rtol, rtol, what + " y");
  expect_close(gdx.get(), rdx, abs_of(rdx), rtol, rtol, what + " dx");
  expect_close(gdw.get(), rdw, mag_sum, rtol, 1e-6, what + " dweight");
  expect_close(gdb.get(), rdb, mag_sum, rtol, 1e-6, what + " dbias");
  // Running statistics: updated in training, untouched in eval.
  expect_close(grm.get(), rrm, abs_of(rrm), rtol, 1e-6, what + " running_mean");
  expect_close(grv.get(), rrv, abs_of(rrv), rtol, 1e-6, what + " running_var");
  if (!training) {
    EXPECT_EQ(grm.get(), rm) << what;
    EXPECT_EQ(grv.get(), rv) << what;
  }
}

TEST(CudaBatchNorm, TrainAndEvalMatchCpuModule) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType dtype : kDtypes)
    for (bool training : {true, false}) {
      run_batch_norm_case(4, 3, 5, 7, dtype, training);
      run_batch_norm_case(2, 16, 8, 8, dtype, training);
      run_batch_norm_case(3, 5, 1, 1, dtype, training);  // HW = 1: statistics over the batch only
      run_batch_norm_case(1, 2, 33, 31, dtype, training);  // one image, more values than threads
    }
}

TEST(CudaBatchNorm, RejectsBadArguments) {
  // Training needs two values per channel; eval needs running statistics.
  EXPECT_THROW(cuda::batch_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        DType::f32, 1, 3, 1, true, 0.1, 1e-5, 0),
               Error);
  EXPECT_THROW(cuda::batch_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        DType::f32, 2, 3, 4, false, 0.1, 1e-5, 0),
               Error);
  EXPECT_THROW(cuda::batch_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        DType::f16, 2, 3, 4, true, 0.1, 1e-5, 0),
               Error);
}

}  // namespace
}  // namespace memtrain
