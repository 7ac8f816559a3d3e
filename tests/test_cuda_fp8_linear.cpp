// FP8 quantization (amp/fp8.h) and the FP8 linear layer (amp/fp8_linear.h) on a CUDA device against the same
// calls on the CPU, on fresh random inputs of several shapes (rows below 128, sizes that are not multiples of 128,
// and multiples), f32 and bf16, delayed and blockwise scaling.
//
// What must match, and why:
//   quantize / dequantize / blockwise / amax   bit for bit: the CUDA kernels implement the CPU's element rules
//       exactly (cuda/convert.h), so codes, inverse scales, dequantized values and amaxes are the same bits
//       (NaN compares equal to NaN; every other value, -0 included, by its bits).
//   fp8_linear y, dx, dW, db   both devices quantize to the same codes and multiply the same dequantized f32
//       values, so only the GEMMs' (and db's) summation order differs. Per element:
//         |cuda - cpu| <= 1e-5 * mag  (+ one bf16 ulp of the larger of the two for a bf16 result)
//       where mag is the sum of the absolute values of the terms (plus |b| for y), computed here in float64 from
//       the dequantized operands: a rounding-error bound that holds under cancellation too. Each side's f32
//       summation error over k <= 257 terms is about u * sqrt(k) * mag ~ 1e-6 mag (u = 2^-24), far inside
//       1e-5 mag; a bf16 result rounds two nearly equal f32 values once more, which can put them one bf16 ulp
//       apart.
//   the delayed-scaling amax histories and scales of Fp8LinearMeta   equal: the amaxes are of identical bits.
// Before each CUDA run the device allocator's cache is filled with 0xFF blocks (NaN), so an output element a
// kernel never writes shows up. Every test but one needs a device (a CUDA tensor cannot exist without one): each
// skips, naming the reason, when none is usable. Fp8QuantizeWithAmax runs everywhere: the CPU side of the one new
// quantization entry point (the other CPU argument checks are in test_fp8_*.cpp).
#include "memtrain/amp/autocast.h"
#include "memtrain/amp/fp8.h"
#include "memtrain/amp/fp8_linear.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "op_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using amp::BlockwiseFp8;
using amp::Fp8Format;
using amp::Fp8LinearMeta;
using amp::Fp8Recipe;
using amp::Fp8ScalingKind;
using amp::Fp8Tiling;
using amp::Fp8Weight;
using testing::expect_error;
using testing::values_of;

const Device kCuda = Device::cuda(0);

std::string kind_name(Fp8ScalingKind k) { return k == Fp8ScalingKind::delayed ? "delayed" : "blockwise"; }
std::string format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

// ---- inputs ----

// Normal values of `shape` seen as (rows, last dim): row r scaled by r % 7 + 1 and columns 128..255 by 8, so that
// per-tile scales differ from one per tensor; rounded to dtype on the CPU.
Tensor varied_normal(const Shape& shape, std::uint64_t seed, DType dtype) {
  std::vector<double> v = values_of(testing::normal(shape, seed));
  const std::int64_t cols = shape.back();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto r = static_cast<std::int64_t>(i) / cols, c = static_cast<std::int64_t>(i) % cols;
    v[i] *= static_cast<double>(r % 7 + 1) * (c / 128 == 1 ? 8.0 : 1.0);
  }
  return tensor(v, shape).to(dtype);
}

// Extreme values at fixed places: NaN, +-Inf, values far past the FP8 range and below its subnormals, zeros of both
// signs. For blockwise, tiles with an Inf or NaN amax take scale 1; the others keep their own scale.
Tensor with_specials(const Tensor& t) {
  std::vector<double> v = values_of(t);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(), 1e30, -3e6, 1e-30, 0.0, -0.0};
  const std::size_t stride = std::max<std::size_t>(v.size() / 9, 1);
  for (std::size_t k = 0; k < std::size(specials) && k * stride + 1 < v.size(); ++k) v[k * stride + 1] = specials[k];
  return tensor(v, t.shape()).to(t.dtype());
}

// Leaves the device allocator's cache holding 0xFF bytes: the next allocations (carved from it) start as NaN.
void poison_device_cache() {
  Tensor t = Tensor::empty({64 << 20}, DType::u8, kCuda);
  t.fill_(255.0);
}

// ---- comparing ----

// t's bytes and values on the host (contiguous), row-major.
struct HostCopy {
  std::vector<std::uint8_t> bytes;
  std::vector<double> values;
  std::size_t element_size = 0;
};

HostCopy host_copy(const Tensor& t) {
  const Tensor h = t.detach().to(Device::cpu()).contiguous();
  HostCopy c;
  c.element_size = h.element_size();
  const auto* p = static_cast<const std::uint8_t*>(h.data_ptr());
  c.bytes.assign(p, p + h.nbytes());
  c.values = values_of(h);
  return c;
}

// got (on cuda:0) equals want (on the CPU) bit for bit, except that any NaN equals any NaN.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no CUDA result";
  ASSERT_TRUE(want.defined()) << what << ": no CPU result";
  EXPECT_EQ(got.device(), kCuda) << what;
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const HostCopy g = host_copy(got), w = host_copy(want);
  const std::size_t es = g.element_size;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.values.size(); ++i) {
    const bool same = std::memcmp(&g.bytes[i * es], &w.bytes[i * es], es) == 0;
    if (!same && !(std::isnan(g.values[i]) && std::isnan(w.values[i])) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.values.size() << " elements differ, first at " << first
                     << " (cuda " << (bad ? g.values[first] : 0.0) << ", cpu " << (bad ? w.values[first] : 0.0)
                     << ")";
}

void expect_same_float(float got, float want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": cuda " << got << ", cpu NaN";
    return;
  }
  EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << what << ": cuda " << got
                                                                                   << ", cpu " << want;
}

// One unit in the last place of bf16 (8 significant bits) at |v|.
double bf16_ulp(double v) {
  int e = 0;
  std::frexp(std::max(std::abs(v), 0x1p-126), &e);  // v = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

// The tolerance of the file's header: |got - want| <= 1e-5 mag (+ one bf16 ulp when the result was rounded to
// bf16: its dtype, or `rounded` for a bf16 result widened afterwards), elementwise.
void expect_within_rounding(const Tensor& got, const Tensor& want, const std::vector<double>& mag,
                            const std::string& what, std::optional<DType> rounded = std::nullopt) {
  ASSERT_TRUE(got.defined()) << what << ": no CUDA result";
  ASSERT_TRUE(want.defined()) << what << ": no CPU result";
  EXPECT_EQ(got.device(), kCuda) << what;
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = host_copy(got).values, w = host_copy(want).values;
  ASSERT_EQ(g.size(), mag.size()) << what;
  int failures = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double ulp =
        rounded.value_or(got.dtype()) == DType::bf16 ? bf16_ulp(std::max(std::abs(g[i]), std::abs(w[i]))) : 0.0;
    const double tol = 1e-5 * mag[i] + ulp;
    const bool ok = std::isfinite(g[i]) && std::isfinite(w[i]) && std::abs(g[i] - w[i]) <= tol;
    if (!ok && failures++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " on cuda, " << w[i] << " on the cpu (tolerance "
                    << tol << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// ---- per-tensor quantization ----

struct QuantCase {
  Shape shape;
  std::uint64_t seed;
};

// Rows below 128, neither dim a multiple of 128, 3-D, and multiples of 128.
const std::vector<QuantCase> kQuantCases{
    {{3, 5}, 1}, {{6, 200}, 2}, {{130, 257}, 3}, {{2, 3, 300}, 4}, {{256, 384}, 5}};

// quantize_fp8 with the scale a delayed recipe would use after a step on x (fp8_max / amax), with a scale that
// saturates the largest values (x 16), and with 1.
std::vector<float> scales_for(const Tensor& x, Fp8Format f) {
  const float a = amp::amax(x);
  const float fitted = std::isfinite(a) && a > 0 ? amp::fp8_max(f) / a : 1.0f;
  return {fitted, 16.0f * fitted, 1.0f};
}

void check_per_tensor(const Tensor& x_cpu, const std::string& what) {
  const Tensor x_dev = x_cpu.to(kCuda);
  expect_same_float(amp::amax(x_dev), amp::amax(x_cpu), what + " amax");
  for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (const float scale : scales_for(x_cpu, f)) {
      const std::string w = what + " " + format_name(f) + " scale " + std::to_string(scale);
      poison_device_cache();
      const Tensor q_cpu = amp::quantize_fp8(x_cpu, f, scale), q_dev = amp::quantize_fp8(x_dev, f, scale);
      expect_same_bits(q_dev, q_cpu, w + " codes");
      const amp::Fp8WithAmax both_cpu = amp::quantize_fp8_with_amax(x_cpu, f, scale),
                             both_dev = amp::quantize_fp8_with_amax(x_dev, f, scale);
      expect_same_bits(both_dev.codes, q_cpu, w + " codes (with amax)");
      expect_same_float(both_dev.amax, both_cpu.amax, w + " amax (with amax)");
      for (const DType out : {DType::f32, DType::bf16}) {
        poison_device_cache();
        expect_same_bits(amp::dequantize_fp8(q_dev, 1.0f / scale, out), amp::dequantize_fp8(q_cpu, 1.0f / scale, out),
                         w + " dequantized to " + std::string(dtype_name(out)));
      }
    }
  }
}

TEST(CudaFp8Quantize, PerTensorAndAmaxMatchTheCpuBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const QuantCase& c : kQuantCases) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const std::string what = shape_str(c.shape) + " " + std::string(dtype_name(dtype));
      SCOPED_TRACE(what);
      check_per_tensor(varied_normal(c.shape, c.seed, dtype), what);
    }
  }
}

TEST(CudaFp8Quantize, SpecialValuesMatchTheCpuBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::string what = std::string("specials ") + std::string(dtype_name(dtype));
    SCOPED_TRACE(what);
    const Tensor x = with_specials(varied_normal({130, 257}, 6, dtype));
    check_per_tensor(x, what);  // amax NaN: the scales are 1, 16 and 1
    for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      for (const Fp8Tiling t : {Fp8Tiling::row_1x128, Fp8Tiling::block_128x128}) {
        const BlockwiseFp8 q_cpu = amp::quantize_fp8_blockwise(x, f, t),
                           q_dev = amp::quantize_fp8_blockwise(x.to(kCuda), f, t);
        expect_same_bits(q_dev.codes, q_cpu.codes, what + " blockwise codes");
        expect_same_bits(q_dev.inv_scales, q_cpu.inv_scales, what + " blockwise inverse scales");
        expect_same_bits(amp::dequantize_fp8_blockwise(q_dev), amp::dequantize_fp8_blockwise(q_cpu),
                         what + " blockwise dequantized");
      }
    }
  }
}

// A transposed view is quantized as its contiguous copy, on the device as on the CPU.
TEST(CudaFp8Quantize, StridedInputMatchesTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const Tensor base = varied_normal({200, 6}, 7, DType::f32);
  const Tensor x_cpu = base.t(), x_dev = base.to(kCuda).t();
  ASSERT_FALSE(x_dev.is_contiguous());
  expect_same_float(amp::amax(x_dev), amp::amax(x_cpu), "amax");
  expect_same_bits(amp::quantize_fp8(x_dev, Fp8Format::e4m3, 3.0f), amp::quantize_fp8(x_cpu, Fp8Format::e4m3, 3.0f),
                   "per-tensor codes");
  const BlockwiseFp8 q_cpu = amp::quantize_fp8_blockwise(x_cpu, Fp8Format::e4m3, Fp8Tiling::row_1x128),
                     q_dev = amp::quantize_fp8_blockwise(x_dev, Fp8Format::e4m3, Fp8Tiling::row_1x128);
  expect_same_bits(q_dev.codes, q_cpu.codes, "blockwise codes");
  expect_same_bits(q_dev.inv_scales, q_cpu.inv_scales, "blockwise inverse scales");
}

// quantize_fp8_with_amax, which fp8_linear's delayed path calls on either device, on the CPU (no device needed):
// the codes of quantize_fp8 and the value of amax, and quantize_fp8's argument checks under its own name.
TEST(Fp8QuantizeWithAmax, OnTheCpuEqualsQuantizeThenAmaxAndChecksItsArguments) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = varied_normal({6, 200}, 9, dtype), s = with_specials(x);
    for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const amp::Fp8WithAmax q = amp::quantize_fp8_with_amax(x, f, 2.5f);
      EXPECT_EQ(q.codes.dtype(), amp::fp8_dtype(f));
      EXPECT_EQ(host_copy(q.codes).bytes, host_copy(amp::quantize_fp8(x, f, 2.5f)).bytes);
      EXPECT_EQ(q.amax, amp::amax(x));
      EXPECT_GT(q.amax, 0.0f);
      EXPECT_TRUE(std::isnan(amp::quantize_fp8_with_amax(s, f, 1.0f).amax));
    }
  }
  const Tensor x = varied_normal({2, 3}, 9, DType::f32);
  expect_error([&] { amp::quantize_fp8_with_amax(x, Fp8Format::e4m3, 0.0f); }, {"amp::quantize_fp8_with_amax", "> 0"});
  expect_error([&] { amp::quantize_fp8_with_amax(x.to(DType::f64), Fp8Format::e4m3, 1.0f); },
               {"amp::quantize_fp8_with_amax", "dtype f64"});
  expect_error([&] { amp::quantize_fp8_with_amax(Tensor(), Fp8Format::e4m3, 1.0f); },
               {"amp::quantize_fp8_with_amax", "undefined"});
}

// ---- blockwise quantization ----

TEST(CudaFp8Quantize, BlockwiseMatchesTheCpuBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const QuantCase& c : kQuantCases) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Tensor x_cpu = varied_normal(c.shape, c.seed + 100, dtype), x_dev = x_cpu.to(kCuda);
      for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        for (const Fp8Tiling t : {Fp8Tiling::row_1x128, Fp8Tiling::block_128x128}) {
          const std::string what = shape_str(c.shape) + " " + std::string(dtype_name(dtype)) + " " + format_name(f) +
                                   (t == Fp8Tiling::row_1x128 ? " 1x128" : " 128x128");
          SCOPED_TRACE(what);
          poison_device_cache();
          const BlockwiseFp8 q_cpu = amp::quantize_fp8_blockwise(x_cpu, f, t),
                             q_dev = amp::quantize_fp8_blockwise(x_dev, f, t);
          EXPECT_EQ(q_dev.tiling, t);
          expect_same_bits(q_dev.codes, q_cpu.codes, what + " codes");
          expect_same_bits(q_dev.inv_scales, q_cpu.inv_scales, what + " inverse scales");
          for (const DType out : {DType::f32, DType::bf16}) {
            poison_device_cache();
            expect_same_bits(amp::dequantize_fp8_blockwise(q_dev, out), amp::dequantize_fp8_blockwise(q_cpu, out),
                             what + " dequantized to " + std::string(dtype_name(out)));
          }
        }
      }
    }
  }
}

TEST(CudaFp8Quantize, BadArgumentsNameTheOp) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const Tensor x = varied_normal({4, 130}, 8, DType::f32).to(kCuda);
  amp::QuantStats stats;
  expect_error([&] { amp::quantize_fp8(x, Fp8Format::e4m3, 1.0f, &stats); },
               {"amp::quantize_fp8", "QuantStats", "cuda:0"});
  expect_error([&] { amp::quantize_fp8_blockwise(x, Fp8Format::e4m3, Fp8Tiling::row_1x128, &stats); },
               {"amp::quantize_fp8_blockwise", "QuantStats", "cuda:0"});
  expect_error([&] { amp::quantize_fp8(x.to(DType::f16), Fp8Format::e4m3, 1.0f); },
               {"amp::quantize_fp8", "dtype f16"});
  expect_error([&] { amp::quantize_fp8(x, Fp8Format::e4m3, 0.0f); }, {"amp::quantize_fp8", "> 0"});
  expect_error([&] { amp::amax(x.to(DType::f16)); }, {"amp::amax", "dtype f16"});
  const Tensor q = amp::quantize_fp8(x, Fp8Format::e4m3, 1.0f);
  expect_error([&] { amp::dequantize_fp8(q, 1.0f, DType::f16); }, {"amp::dequantize_fp8", "output dtype f16"});
  BlockwiseFp8 b = amp::quantize_fp8_blockwise(x, Fp8Format::e5m2, Fp8Tiling::row_1x128);
  b.inv_scales = b.inv_scales.to(Device::cpu());
  expect_error([&] { amp::dequantize_fp8_blockwise(b); }, {"amp::dequantize_fp8_blockwise", "cpu", "cuda:0"});
}

// ---- fp8_linear ----

struct LinearCase {
  Shape x_shape;  // [..., in]; for a strided case the base [in, rows] that x is the transpose of
  std::int64_t out;
  DType x_dtype, w_dtype;  // the bias has the weight's dtype
  std::uint64_t seed;
  bool strided = false;
};

// Rows below 128 (6) and above (130, 256); in / out neither multiples of 128 nor below it, and multiples; f32,
// a bf16 input with f32 parameters (the fp8 policy's mix), all bf16; and a transposed view as x.
const std::vector<LinearCase> kLinearCases{
    {{2, 3, 200}, 150, DType::f32, DType::f32, 10},   {{2, 3, 200}, 150, DType::bf16, DType::f32, 11},
    {{130, 257}, 129, DType::f32, DType::f32, 12},    {{130, 257}, 129, DType::bf16, DType::bf16, 13},
    {{2, 128, 128}, 256, DType::bf16, DType::f32, 14}, {{200, 6}, 140, DType::f32, DType::f32, 15, true},
};

struct LinearInputs {
  Tensor x, w, b, dy;  // CPU; x is a transposed view when strided
  bool strided = false;
};

LinearInputs make_linear_inputs(const LinearCase& c, std::uint64_t step) {
  const std::uint64_t seed = c.seed * 10 + step * 5;
  LinearInputs in;
  in.strided = c.strided;
  in.x = varied_normal(c.x_shape, seed, c.x_dtype);
  if (c.strided) in.x = in.x.t();  // [rows, in] with strides (1, rows)
  const std::int64_t in_features = in.x.size(-1);
  in.w = ops::mul(varied_normal({c.out, in_features}, seed + 1, DType::f64), 0.05).to(c.w_dtype);
  in.b = testing::normal({c.out}, seed + 2, c.w_dtype);
  Shape y_shape(in.x.shape().begin(), in.x.shape().end() - 1);
  y_shape.push_back(c.out);
  in.dy = varied_normal(y_shape, seed + 3, c.x_dtype);
  return in;
}

// One device's step: leaves made from the inputs, the weight quantized, forward, backward.
struct LinearRun {
  Fp8Weight wq;
  Tensor y, dx, dw, db;
};

LinearRun run_linear(const LinearInputs& in, Device device, const Fp8Recipe& recipe, Fp8LinearMeta* meta) {
  // x's leaf: x itself, or the base of the transposed view (where its gradient lands).
  const Tensor leaf = (in.strided ? in.x.t() : in.x).detach().to(device).set_requires_grad();
  const Tensor x = in.strided ? leaf.t() : leaf;
  const Tensor w = in.w.detach().to(device).set_requires_grad(), b = in.b.detach().to(device).set_requires_grad();
  const bool on_device = device.is_cuda();
  LinearRun r;
  if (on_device) poison_device_cache();
  r.wq = amp::quantize_weight(w, recipe, meta);
  if (on_device) poison_device_cache();
  r.y = amp::fp8_linear(x, w, r.wq, b, recipe, meta);
  const Tensor dy = in.dy.to(device);
  if (on_device) poison_device_cache();
  r.y.backward(dy);
  r.dx = in.strided ? leaf.grad().t() : leaf.grad();
  r.dw = w.grad();
  r.db = b.grad();
  return r;
}

// The FP8 values fp8_linear multiplies, as doubles: t viewed as (rows, last dim), quantized with the recipe's
// scale (delayed: the meta's scale and inverse scale before the step) or per tile.
std::vector<double> fp8_values(const Tensor& t, Fp8Format f, Fp8ScalingKind kind, const amp::Fp8TensorMeta* meta,
                               Fp8Tiling tiling) {
  const Tensor m = t.detach().contiguous().reshape({-1, t.size(-1)});
  if (kind == Fp8ScalingKind::delayed) {
    return values_of(amp::dequantize_fp8(amp::quantize_fp8(m, f, meta->scale()), meta->inv_scale()));
  }
  return values_of(amp::dequantize_fp8_blockwise(amp::quantize_fp8_blockwise(m, f, tiling)));
}

// mag[i, j] = sum over l of |a(i, l) b(l, j)|, in float64: the size of any summation order's rounding error.
template <typename A, typename B>
std::vector<double> abs_product(std::int64_t m, std::int64_t n, std::int64_t k, A a, B b) {
  std::vector<double> mag(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) s += std::abs(a(i, l) * b(l, j));
      mag[static_cast<std::size_t>(i * n + j)] = s;
    }
  }
  return mag;
}

std::int64_t rows_of(const Shape& s) { return shape_numel(s) / s.back(); }

struct Magnitudes {
  std::vector<double> y, dx, dw, db;
};

// The magnitudes of the four results' sums, from the operands as quantized with `meta`'s scales (before the step).
Magnitudes magnitudes(const LinearInputs& in, Fp8ScalingKind kind, const Fp8LinearMeta* meta) {
  const std::int64_t in_f = in.w.size(1), out = in.w.size(0), rows = rows_of(in.x.shape());
  const std::vector<double> xd = fp8_values(in.x, Fp8Format::e4m3, kind, meta ? &meta->input : nullptr,
                                            Fp8Tiling::row_1x128);
  const std::vector<double> wd = fp8_values(in.w, Fp8Format::e4m3, kind, meta ? &meta->weight : nullptr,
                                            Fp8Tiling::block_128x128);
  const std::vector<double> gd = fp8_values(in.dy, Fp8Format::e5m2, kind, meta ? &meta->grad : nullptr,
                                            Fp8Tiling::row_1x128);
  const std::vector<double> bias = values_of(in.b), dy = values_of(in.dy);
  Magnitudes m;
  m.y = abs_product(rows, out, in_f, [&](auto n, auto i) { return xd[n * in_f + i]; },
                    [&](auto i, auto o) { return wd[o * in_f + i]; });
  for (std::int64_t n = 0; n < rows; ++n) {
    for (std::int64_t o = 0; o < out; ++o) m.y[n * out + o] += std::abs(bias[o]);
  }
  m.dx = abs_product(rows, in_f, out, [&](auto n, auto o) { return gd[n * out + o]; },
                     [&](auto o, auto i) { return wd[o * in_f + i]; });
  m.dw = abs_product(out, in_f, rows, [&](auto o, auto n) { return gd[n * out + o]; },
                     [&](auto n, auto i) { return xd[n * in_f + i]; });
  m.db = abs_product(1, out, rows, [](auto, auto) { return 1.0; }, [&](auto n, auto o) { return dy[n * out + o]; });
  return m;
}

void expect_same_history(const amp::Fp8TensorMeta& got, const amp::Fp8TensorMeta& want, const std::string& what) {
  const std::vector<float> g = got.amax_history(), w = want.amax_history();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (std::size_t i = 0; i < g.size(); ++i) expect_same_float(g[i], w[i], what + " amax " + std::to_string(i));
  expect_same_float(got.scale(), want.scale(), what + " scale");
  expect_same_float(got.inv_scale(), want.inv_scale(), what + " inverse scale");
}

void expect_same_metas(const Fp8LinearMeta& got, const Fp8LinearMeta& want, const std::string& what) {
  expect_same_history(got.input, want.input, what + " input");
  expect_same_history(got.weight, want.weight, what + " weight");
  expect_same_history(got.grad, want.grad, what + " grad");
}

// Delayed scales from the inputs' own amaxes, as after a step on the same data, so the first step already
// quantizes with scales other than 1.
void warm_up(Fp8LinearMeta& meta, const LinearInputs& in) {
  meta.input.record_amax(amp::amax(in.x));
  meta.weight.record_amax(amp::amax(in.w));
  meta.grad.record_amax(amp::amax(in.dy));
  meta.update_scales();
}

// Two steps on both devices (delayed: each device with its own copy of one meta, update_scales between the steps,
// so the second step quantizes with scales from the first one's amaxes).
void check_linear(const LinearCase& c, Fp8ScalingKind kind) {
  Fp8Recipe recipe;
  recipe.kind = kind;
  std::optional<Fp8LinearMeta> meta_cpu, meta_dev;
  if (kind == Fp8ScalingKind::delayed) {
    warm_up(meta_cpu.emplace(), make_linear_inputs(c, 0));
    meta_dev = *meta_cpu;
  }
  for (std::uint64_t step = 0; step < 2; ++step) {
    const std::string what = "step " + std::to_string(step);
    SCOPED_TRACE(what);
    const LinearInputs in = make_linear_inputs(c, step);
    const Magnitudes mag = magnitudes(in, kind, meta_cpu ? &*meta_cpu : nullptr);
    const LinearRun cpu = run_linear(in, Device::cpu(), recipe, meta_cpu ? &*meta_cpu : nullptr);
    const LinearRun dev = run_linear(in, kCuda, recipe, meta_dev ? &*meta_dev : nullptr);

    expect_same_bits(dev.wq.codes, cpu.wq.codes, "FP8 weight codes");
    if (kind == Fp8ScalingKind::blockwise) {
      expect_same_bits(dev.wq.inv_scales, cpu.wq.inv_scales, "FP8 weight inverse scales");
    } else {
      // The delayed inverse scale stays on the host, where the meta is.
      EXPECT_TRUE(dev.wq.inv_scales.device().is_cpu()) << dev.wq.inv_scales.device().str();
      EXPECT_EQ(values_of(dev.wq.inv_scales), values_of(cpu.wq.inv_scales));
    }
    EXPECT_EQ(dev.wq.bytes(), cpu.wq.bytes());
    expect_within_rounding(dev.y, cpu.y, mag.y, "y");
    expect_within_rounding(dev.dx, cpu.dx, mag.dx, "dx");
    expect_within_rounding(dev.dw, cpu.dw, mag.dw, "dW");
    expect_within_rounding(dev.db, cpu.db, mag.db, "db");
    if (meta_cpu) {
      expect_same_metas(*meta_dev, *meta_cpu, "after the step");
      meta_cpu->update_scales();
      meta_dev->update_scales();
      expect_same_metas(*meta_dev, *meta_cpu, "after update_scales");
    }
  }
}

std::string case_name(const LinearCase& c) {
  return shape_str(c.x_shape) + (c.strided ? ".t()" : "") + " -> " + std::to_string(c.out) + ", x " +
         std::string(dtype_name(c.x_dtype)) + ", weight " + std::string(dtype_name(c.w_dtype));
}

TEST(CudaFp8Linear, BlockwiseForwardAndBackwardMatchTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const LinearCase& c : kLinearCases) {
    SCOPED_TRACE(case_name(c));
    check_linear(c, Fp8ScalingKind::blockwise);
  }
}

TEST(CudaFp8Linear, DelayedForwardAndBackwardMatchTheCpuAndRecordTheSameAmaxes) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const LinearCase& c : kLinearCases) {
    SCOPED_TRACE(case_name(c));
    check_linear(c, Fp8ScalingKind::delayed);
  }
}

// Without a bias, and with only some inputs wanting gradients: the same results as the CPU, and the gradients that
// are not wanted stay undefined.
TEST(CudaFp8Linear, NoBiasAndPartialGradientsMatchTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const LinearCase c{{130, 257}, 129, DType::bf16, DType::f32, 16};
  const LinearInputs in = make_linear_inputs(c, 0);
  const Magnitudes mag = magnitudes(in, Fp8ScalingKind::blockwise, nullptr);
  const Fp8Recipe recipe;  // blockwise
  for (const bool x_grad : {false, true}) {
    SCOPED_TRACE(x_grad ? "x wants a gradient, the weight does not" : "the weight wants a gradient, x does not");
    std::vector<Tensor> y, dx, dw;
    for (const Device device : {Device::cpu(), kCuda}) {
      const Tensor x = in.x.detach().to(device).set_requires_grad(x_grad),
                   w = in.w.detach().to(device).set_requires_grad(!x_grad);
      if (device.is_cuda()) poison_device_cache();
      const Tensor out = amp::fp8_linear(x, w, amp::quantize_weight(w, recipe, nullptr), Tensor(), recipe, nullptr);
      out.backward(in.dy.to(device));
      y.push_back(out);
      dx.push_back(x.grad());
      dw.push_back(w.grad());
    }
    // Without the bias, y's magnitude is the product's alone; mag.y (which adds |b|) only loosens the bound.
    expect_within_rounding(y[1], y[0], mag.y, "y");
    EXPECT_EQ(dx[1].defined(), x_grad);
    EXPECT_EQ(dw[1].defined(), !x_grad);
    if (x_grad) expect_within_rounding(dx[1], dx[0], mag.dx, "dx");
    else expect_within_rounding(dw[1], dw[0], mag.dw, "dW");
  }
}

// ---- memory ----

std::size_t live(Device d, MemoryCategory c) { return Allocator::get(d).stats()[c].live_bytes; }

// On the device as on the CPU (test_fp8_linear.cpp): the forward keeps only x's FP8 codes (+ blockwise scales, on
// the device) and the output as activations, and leaves no workspace alive; the delayed inverse scale (4 bytes)
// is kept on the host.
TEST(CudaFp8Linear, KeepsCodesScalesAndOutputAsOnTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::int64_t kRows = 6, kIn = 200, kOut = 150;
  const Tensor source = varied_normal({2, 3, kIn}, 40, DType::f32).to(kCuda);
  Tensor w = varied_normal({kOut, kIn}, 41, DType::f32).to(kCuda).set_requires_grad();
  const std::size_t codes = kRows * kIn, output = kRows * kOut * 2;
  for (const Fp8ScalingKind kind : {Fp8ScalingKind::blockwise, Fp8ScalingKind::delayed}) {
    SCOPED_TRACE(kind_name(kind));
    Fp8Recipe recipe;
    recipe.kind = kind;
    Fp8LinearMeta meta;
    Fp8LinearMeta* m = kind == Fp8ScalingKind::delayed ? &meta : nullptr;
    const Fp8Weight wq = amp::quantize_weight(w, recipe, m);
    const auto forward = [&](const Tensor& x) { return amp::fp8_linear(x, w, wq, Tensor(), recipe, m); };
    // A first step outside the measurement: cuBLAS's workspace is made at the first GEMM and kept.
    {
      const Tensor y = forward(source.to(DType::bf16));
      y.backward(ones(y.shape(), DType::bf16, kCuda));
      w.set_grad(Tensor());
    }
    const std::size_t dev_before = live(kCuda, MemoryCategory::activations),
                      dev_workspace = live(kCuda, MemoryCategory::workspace),
                      host_before = live(Device::cpu(), MemoryCategory::activations);
    Tensor y;
    {
      CategoryGuard activations(MemoryCategory::activations);
      const Tensor x = source.to(DType::bf16);
      y = forward(x);
    }
    EXPECT_EQ(live(kCuda, MemoryCategory::workspace), dev_workspace) << "workspace left alive";
    const std::size_t scales = kind == Fp8ScalingKind::blockwise ? kRows * 2 * 4 : 0;  // 1x128 tiles: 2 per row
    EXPECT_EQ(live(kCuda, MemoryCategory::activations) - dev_before, codes + scales + output);
    EXPECT_EQ(live(Device::cpu(), MemoryCategory::activations) - host_before,
              kind == Fp8ScalingKind::delayed ? 4u : 0u);
    // The backward works from what was kept, and the saved bytes go with the graph.
    const std::size_t before_backward = live(kCuda, MemoryCategory::activations);
    y.backward(ones(y.shape(), DType::bf16, kCuda));
    EXPECT_TRUE(w.grad().defined());
    EXPECT_EQ(live(kCuda, MemoryCategory::activations), before_backward - codes - scales);
    w.set_grad(Tensor());
  }
}

// ---- the fp8 policy (amp::Autocast with an Fp8State) ----

// ops::linear under Autocast(Fp8State) with the parameters on the device: Fp8State keys its metas by the device
// weight and the guard quantizes it there; results as on the CPU, and the same amaxes recorded.
TEST(CudaFp8Linear, AutocastFp8StateOnDeviceWeightsMatchesTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const LinearCase c{{2, 3, 200}, 150, DType::f32, DType::f32, 17};
  for (const Fp8ScalingKind kind : {Fp8ScalingKind::blockwise, Fp8ScalingKind::delayed}) {
    SCOPED_TRACE(kind_name(kind));
    Fp8Recipe recipe;
    recipe.kind = kind;
    const LinearInputs in = make_linear_inputs(c, 0);
    std::vector<LinearRun> runs;
    std::vector<std::optional<Fp8LinearMeta>> metas;
    for (const Device device : {Device::cpu(), kCuda}) {
      amp::Fp8State fp8(recipe);
      const Tensor x = in.x.detach().to(device).set_requires_grad(), w = in.w.detach().to(device).set_requires_grad(),
                   b = in.b.detach().to(device).set_requires_grad();
      LinearRun r;
      {
        amp::Autocast guard(fp8);
        if (device.is_cuda()) poison_device_cache();
        r.y = ops::linear(x, w, b);
      }
      EXPECT_EQ(r.y.dtype(), DType::bf16);
      r.y.backward(in.dy.to(DType::bf16).to(device));
      r.dx = x.grad();
      r.dw = w.grad();
      r.db = b.grad();
      runs.push_back(r);
      EXPECT_EQ(fp8.layers(), kind == Fp8ScalingKind::delayed ? 1u : 0u);
      metas.emplace_back();
      if (Fp8LinearMeta* m = fp8.meta_for(w)) metas.back() = *m;
    }
    // The policy quantizes x in bf16 and dy is bf16: the magnitudes of those operands (scales 1: a fresh meta).
    LinearInputs q = in;
    q.x = in.x.to(DType::bf16);
    q.dy = in.dy.to(DType::bf16);
    const Fp8LinearMeta fresh;
    const Magnitudes mag = magnitudes(q, kind, kind == Fp8ScalingKind::delayed ? &fresh : nullptr);
    expect_within_rounding(runs[1].y, runs[0].y, mag.y, "y");
    // dx is fp8_linear's bf16 gradient of the bf16 copy of x, widened to x's f32 exactly: bf16 rounding.
    EXPECT_EQ(runs[1].dx.dtype(), DType::f32);
    expect_within_rounding(runs[1].dx, runs[0].dx, mag.dx, "dx", DType::bf16);
    expect_within_rounding(runs[1].dw, runs[0].dw, mag.dw, "dW");
    expect_within_rounding(runs[1].db, runs[0].db, mag.db, "db");
    if (kind == Fp8ScalingKind::delayed) {
      ASSERT_TRUE(metas[0] && metas[1]);
      expect_same_metas(*metas[1], *metas[0], "the policy's meta");
    }
  }
}

// ---- argument checks ----

TEST(CudaFp8Linear, MixedDevicesAreRefusedNamingTheOperand) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const LinearInputs in = make_linear_inputs({{4, 200}, 150, DType::f32, DType::f32, 18}, 0);
  const Tensor x = in.x.to(kCuda), w = in.w.to(kCuda), b = in.b.to(kCuda);
  const Fp8Recipe block, delayed{Fp8ScalingKind::delayed, {}};
  Fp8LinearMeta meta;
  const Fp8Weight wq = amp::quantize_weight(w, block, nullptr), wq_cpu = amp::quantize_weight(in.w, block, nullptr);
  const auto call = [&](const Tensor& xx, const Tensor& ww, const Fp8Weight& q, const Tensor& bb) {
    return [=] { amp::fp8_linear(xx, ww, q, bb, Fp8Recipe{}, nullptr); };
  };
  expect_error(call(x, in.w, wq, b), {"fp8_linear", "weight is on cpu", "cuda:0", "one device"});
  expect_error(call(in.x, w, wq, in.b), {"fp8_linear", "weight is on cuda:0", "the input on cpu"});
  expect_error(call(x, w, wq, in.b), {"fp8_linear", "bias is on cpu", "one device"});
  expect_error(call(x, w, wq_cpu, b), {"fp8_linear", "the FP8 weight is on cpu"});
  Fp8Weight scales_on_host = wq;
  scales_on_host.inv_scales = wq.inv_scales.to(Device::cpu());
  expect_error(call(x, w, scales_on_host, b), {"fp8_linear", "scale grid is on cpu", "one device"});
  expect_error(call(x.to(DType::f16), w, wq, b), {"fp8_linear", "input dtype f16"});
  // A delayed weight's inverse scale is a host value by design: accepted beside device codes.
  const Fp8Weight wq_delayed = amp::quantize_weight(w, delayed, &meta);
  EXPECT_TRUE(wq_delayed.inv_scales.device().is_cpu());
  EXPECT_NO_THROW(amp::fp8_linear(x, w, wq_delayed, b, delayed, &meta));
  // The policy checks the devices before it quantizes (and caches) the weight.
  amp::Fp8State fp8(block);
  amp::Autocast guard(fp8);
  expect_error([&] { ops::linear(in.x, w, b); }, {"linear", "one device", "cpu", "cuda:0"});
}

}  // namespace
}  // namespace memtrain
