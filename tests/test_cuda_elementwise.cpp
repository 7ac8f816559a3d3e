// The elementwise ops (memtrain/ops/elementwise.h) on a CUDA device against the same ops on the CPU:
// binary arithmetic with broadcasting and strided inputs, tensor-scalar arithmetic, every unary op,
// where / masked_fill and the comparisons, in place add_/mul_, and the gradients of every differentiable
// op through autograd. Each case makes CPU inputs, runs the op on them and on cuda:0 copies, and compares
// element by element: |cuda - cpu| <= tol * (|cpu| + rms(cpu)), NaN exactly where the CPU has NaN. The
// rms term admits results that are small differences of large terms (e.g. gelu' for negative x), where
// both devices are only accurate relative to the terms.
// Tolerances, and why:
//   f32 1e-5, f64 1e-10: both compute in the same precision with the same formulas; device exp/tanh/erf
//       differ from libm by a few ulps, which a few ops amplify slightly.
//   bf16 1e-2, f16 4e-3: both widen the same values to f32 and round once, so a result near a rounding
//       boundary may round the other way: one ulp (2^-8 bf16, 2^-10 f16 relative).
//   comparisons, masked_fill, where's output: bit-identical (no arithmetic); where's gradients sum over
//       broadcast dims (sum_to) and get the float tolerance.
// Before each CUDA run the device allocator's cache is filled with 0xFF blocks (NaN in every float dtype)
// of the sizes about to be allocated, so an element a kernel never writes shows up as NaN.
// Every test that needs a device skips cleanly without it.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "cuda/elementwise.h"
#include "memtrain/ops/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

#define SKIP_WITHOUT_DEVICE()                                              \
  do {                                                                     \
    if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason(); \
  } while (0)

const Device kCuda = Device::cuda(0);
const DType kFloatDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-10;
    case DType::bf16: return 1e-2;
    case DType::f16: return 4e-3;
    default: return 1e-5;
  }
}

// ---- inputs ----

// Uniform values in [lo, hi) rounded to dtype, seeded per call.
Tensor random_uniform(const Shape& shape, DType dtype, std::uint64_t seed, double lo = -2.0, double hi = 2.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (double& x : v) x = dist(rng);
  return from_buffer(v.data(), shape, DType::f64, dtype);
}

// Small integers in [0, k) (so equality is frequent), stored as dtype.
Tensor random_small_ints(const Shape& shape, DType dtype, std::uint64_t seed, int k = 3) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(0, k - 1);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (double& x : v) x = dist(rng);
  return from_buffer(v.data(), shape, DType::f64, dtype);
}

Tensor random_mask(const Shape& shape, std::uint64_t seed) { return random_small_ints(shape, DType::boolean, seed, 2); }

// ---- comparing ----

std::vector<double> host_values(const Tensor& t) {
  Tensor h = t.detach();
  if (h.device().is_cuda()) h = h.to(Device::cpu());
  h = h.to(DType::f64).contiguous();
  const double* p = h.data<double>();
  return std::vector<double>(p, p + h.numel());
}

// Element by element, as described at the top; tol 0 demands identical values.
void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no CUDA result";
  ASSERT_TRUE(want.defined()) << what << ": no CPU result";
  EXPECT_TRUE(got.device().is_cuda()) << what << " is on " << got.device().str();
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  EXPECT_EQ(dtype_name(got.dtype()), dtype_name(want.dtype())) << what;
  const std::vector<double> g = host_values(got), w = host_values(want);
  double sum2 = 0;
  std::size_t finite = 0;
  for (double x : w) {
    if (std::isfinite(x)) sum2 += x * x, ++finite;
  }
  const double rms = finite ? std::sqrt(sum2 / static_cast<double>(finite)) : 0.0;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    bool ok;
    if (std::isnan(w[i]) || std::isnan(g[i])) ok = std::isnan(w[i]) && std::isnan(g[i]);
    else if (std::isinf(w[i]) || std::isinf(g[i])) ok = g[i] == w[i];
    else ok = std::abs(g[i] - w[i]) <= tol * (std::abs(w[i]) + rms);
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.size() << " elements differ, first at " << first
                     << " (got " << (bad ? g[first] : 0.0) << ", want " << (bad ? w[first] : 0.0) << ")";
}

// Leaves the next device allocations of these byte sizes 0xFF-filled: allocate, fill, free to the cache.
void poison_device_cache(const std::vector<std::size_t>& sizes) {
  std::vector<Tensor> hold;
  for (std::size_t n : sizes) {
    if (n == 0) continue;
    for (int copy = 0; copy < 4; ++copy) {
      Tensor t = Tensor::empty({static_cast<std::int64_t>(n)}, DType::u8, kCuda);
      t.fill_(255.0);
      hold.push_back(t);
    }
  }
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs f on CPU leaves made from `inputs` (entry i requires grad when grad[i]) and on cuda:0 copies;
// compares the outputs, then, when any input wants a gradient, backward with one random output gradient
// and every requested input gradient.
void compare_with_cpu(const std::string& what, const std::vector<Tensor>& inputs, const std::vector<bool>& grad,
                      const OpFn& f, double tol, std::uint64_t seed) {
  SCOPED_TRACE(what);
  ASSERT_EQ(inputs.size(), grad.size());
  std::vector<Tensor> on_cpu, on_dev;
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor c = inputs[i].detach(), d = inputs[i].detach().to(kCuda);
    if (grad[i]) {
      c.set_requires_grad(true);
      d.set_requires_grad(true);
    }
    sizes.push_back(inputs[i].nbytes());
    on_cpu.push_back(c);
    on_dev.push_back(d);
  }
  const Tensor y_cpu = f(on_cpu);
  sizes.push_back(y_cpu.nbytes());
  poison_device_cache(sizes);
  const Tensor y_dev = f(on_dev);
  expect_close(y_dev, y_cpu, tol, "output");

  if (std::none_of(grad.begin(), grad.end(), [](bool g) { return g; })) return;
  const Tensor w = random_uniform(y_cpu.shape(), y_cpu.dtype(), seed ^ 0x5eed);
  y_cpu.backward(w);
  poison_device_cache(sizes);
  y_dev.backward(w.to(kCuda));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (grad[i]) expect_close(on_dev[i].grad(), on_cpu[i].grad(), tol, "gradient of input " + std::to_string(i));
  }
}

std::string name_of(DType dtype, const Shape& shape) { return std::string(dtype_name(dtype)) + " " + shape_str(shape); }

// Shapes of the binary cases: 0-d, scalar tensor against a vector, the broadcast [4,1,5] x [3,1], a bias
// add, empty, and odd sizes above 65536 (same shape, and broadcast over rows).
struct BinaryShapes {
  Shape a, b;
};
const std::vector<BinaryShapes> kBinaryShapes = {
    {{}, {}},       {{5}, {}},           {{}, {5}},           {{4, 1, 5}, {3, 1}}, {{2, 3}, {3}},
    {{0, 3}, {3}},  {{70001}, {70001}},  {{257, 301}, {301}}, {{3, 1, 2, 1, 2}, {2, 3, 1, 2}},
};

// Shapes of the unary cases: 0-d, empty, odd sizes, one above 65536.
const std::vector<Shape> kUnaryShapes = {{}, {0}, {3, 0, 2}, {7}, {4, 1, 5}, {70001}};

// ---- binary arithmetic ----

struct NamedBinary {
  const char* name;
  Tensor (*fn)(const Tensor&, const Tensor&);
};
const NamedBinary kBinaryOps[] = {
    {"add", ops::add}, {"sub", ops::sub}, {"mul", ops::mul}, {"div", ops::div}};

TEST(CudaElementwiseOps, BinaryOpsBroadcastMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 1000;
  for (const NamedBinary& op : kBinaryOps) {
    for (DType dtype : kFloatDtypes) {
      for (const BinaryShapes& s : kBinaryShapes) {
        const Tensor a = random_uniform(s.a, dtype, ++seed);
        // Divisors away from 0, so gradients (-a / b^2) stay well scaled.
        const Tensor b = std::string(op.name) == "div" ? random_uniform(s.b, dtype, ++seed, 0.5, 2.0)
                                                       : random_uniform(s.b, dtype, ++seed);
        const OpFn f = [&](const std::vector<Tensor>& in) { return op.fn(in[0], in[1]); };
        compare_with_cpu(std::string(op.name) + " " + name_of(dtype, s.a) + " x " + shape_str(s.b), {a, b},
                         {true, true}, f, tolerance(dtype), seed);
      }
    }
  }
}

// Views read in place: a transposed operand, a stepped slice, an expanded (stride-0) one.
TEST(CudaElementwiseOps, BinaryOpsOnStridedViewsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 2000;
  for (const NamedBinary& op : kBinaryOps) {
    for (DType dtype : kFloatDtypes) {
      const Tensor a = random_uniform({33, 65}, dtype, ++seed);
      const Tensor b = random_uniform({65, 33}, dtype, ++seed, 0.5, 2.0);
      const OpFn transposed = [&](const std::vector<Tensor>& in) { return op.fn(in[0].t(), in[1]); };
      compare_with_cpu(std::string(op.name) + " transposed " + name_of(dtype, {33, 65}), {a, b}, {true, true},
                       transposed, tolerance(dtype), seed);
      const Tensor c = random_uniform({65, 66}, dtype, ++seed, 0.5, 2.0);
      const OpFn sliced = [&](const std::vector<Tensor>& in) {
        return op.fn(in[0].t(), in[1].slice(1, 0, 66, 2));  // [65, 33] with row stride 66, column stride 2
      };
      compare_with_cpu(std::string(op.name) + " stepped slice " + name_of(dtype, {65, 66}), {a, c}, {true, true},
                       sliced, tolerance(dtype), seed);
      const Tensor d = random_uniform({1, 33}, dtype, ++seed, 0.5, 2.0);
      const OpFn expanded = [&](const std::vector<Tensor>& in) { return op.fn(in[0], in[1].expand({65, 33})); };
      compare_with_cpu(std::string(op.name) + " expanded " + name_of(dtype, {1, 33}), {b, d}, {true, true}, expanded,
                       tolerance(dtype), seed);
    }
  }
}

// More than the kernel's 8 dims after merging (b's stride-0 dims alternate, so nothing merges): the host
// loops over the outer ones.
TEST(CudaElementwiseOps, DeepBroadcastBeyondKernelRankMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const Tensor a = random_uniform({2, 3, 2, 3, 2, 3, 2, 3, 2, 3}, DType::f32, 1);  // a.t(): [3, 2, 2, 3, ...]
  const Tensor b = random_uniform({1, 2, 1, 3, 1, 3, 1, 3, 1, 3}, DType::f32, 2);
  compare_with_cpu("add rank 10", {a, b}, {false, false},
                   [](const std::vector<Tensor>& in) { return ops::add(in[0].t(), in[1]); }, 1e-6, 3);
}

// ---- tensor-scalar arithmetic ----

TEST(CudaElementwiseOps, ScalarOpsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
  };
  const Case cases[] = {
      {"add", [](const Tensor& x) { return ops::add(x, 0.3); }},
      {"sub", [](const Tensor& x) { return ops::sub(x, 1.7); }},
      {"rsub", [](const Tensor& x) { return ops::rsub(2.5, x); }},
      {"mul", [](const Tensor& x) { return ops::mul(x, -1.3); }},
      {"div", [](const Tensor& x) { return ops::div(x, 3.0); }},
      {"rdiv", [](const Tensor& x) { return ops::rdiv(0.7, x); }},
      {"neg", [](const Tensor& x) { return ops::neg(x); }},
  };
  std::uint64_t seed = 3000;
  for (const Case& c : cases) {
    for (DType dtype : kFloatDtypes) {
      for (const Shape& shape : kUnaryShapes) {
        // rdiv's input stays away from 0 (its gradient is -s / x^2).
        const Tensor x = random_uniform(shape, dtype, ++seed, 0.5, 2.0);
        compare_with_cpu(std::string(c.name) + " " + name_of(dtype, shape), {x}, {true},
                         [&](const std::vector<Tensor>& in) { return c.fn(in[0]); }, tolerance(dtype), seed);
      }
      const Tensor m = random_uniform({20, 9}, dtype, ++seed, 0.5, 2.0);
      compare_with_cpu(std::string(c.name) + " transposed " + name_of(dtype, {20, 9}), {m}, {true},
                       [&](const std::vector<Tensor>& in) { return c.fn(in[0].t()); }, tolerance(dtype), seed);
    }
  }
}

// ---- unary ops ----

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  double lo, hi;  // input range (log, sqrt, rsqrt and fractional powers need positive inputs)
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"abs", [](const Tensor& x) { return ops::abs(x); }, -2, 2},
      {"exp", [](const Tensor& x) { return ops::exp(x); }, -3, 3},
      {"log", [](const Tensor& x) { return ops::log(x); }, 0.1, 4},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }, 0.1, 4},
      {"rsqrt", [](const Tensor& x) { return ops::rsqrt(x); }, 0.1, 4},
      {"pow 2", [](const Tensor& x) { return ops::pow(x, 2.0); }, -2, 2},
      {"pow 3", [](const Tensor& x) { return ops::pow(x, 3.0); }, -2, 2},
      {"pow 0.5", [](const Tensor& x) { return ops::pow(x, 0.5); }, 0.1, 4},
      {"pow -1.5", [](const Tensor& x) { return ops::pow(x, -1.5); }, 0.5, 4},
      {"pow 0", [](const Tensor& x) { return ops::pow(x, 0.0); }, -2, 2},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, -4, 4},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }, -8, 8},
      {"relu", [](const Tensor& x) { return ops::relu(x); }, -2, 2},
      {"gelu tanh", [](const Tensor& x) { return ops::gelu(x, ops::GeluApproximation::tanh); }, -4, 4},
      {"gelu erf", [](const Tensor& x) { return ops::gelu(x, ops::GeluApproximation::none); }, -4, 4},
      {"silu", [](const Tensor& x) { return ops::silu(x); }, -6, 6},
      {"clamp", [](const Tensor& x) { return ops::clamp(x, -0.5, 0.75); }, -2, 2},
  };
  return cases;
}

TEST(CudaElementwiseOps, UnaryOpsAndGradientsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 4000;
  for (const UnaryCase& c : unary_cases()) {
    for (DType dtype : kFloatDtypes) {
      for (const Shape& shape : kUnaryShapes) {
        const Tensor x = random_uniform(shape, dtype, ++seed, c.lo, c.hi);
        compare_with_cpu(std::string(c.name) + " " + name_of(dtype, shape), {x}, {true},
                         [&](const std::vector<Tensor>& in) { return c.fn(in[0]); }, tolerance(dtype), seed);
      }
      // A transposed view: gelu tanh then takes the elementwise kernel rather than the fused nn one.
      const Tensor m = random_uniform({33, 65}, dtype, ++seed, c.lo, c.hi);
      compare_with_cpu(std::string(c.name) + " transposed " + name_of(dtype, {33, 65}), {m}, {true},
                       [&](const std::vector<Tensor>& in) { return c.fn(in[0].t()); }, tolerance(dtype), seed);
    }
  }
}

// NaN and infinities go through as on the CPU (relu and clamp keep NaN; exp overflows to Inf). Not for
// tanh-GELU at +-Inf: the CPU's vector exp saturates at e^88 where the device's overflows, so gelu(-Inf)
// is -Inf on one and NaN on the other (both meaningless there).
TEST(CudaElementwiseOps, UnaryOpsPropagateSpecialValuesLikeCpu) {
  SKIP_WITHOUT_DEVICE();
  const double inf = INFINITY;
  const std::vector<double> with_inf = {NAN, inf, -inf, 0.0, -0.0, 100.0, -100.0, 1e-30};
  const std::vector<double> finite = {NAN, 0.0, -0.0, 100.0, -100.0, 1e-30};
  for (DType dtype : kFloatDtypes) {
    for (const UnaryCase& c : unary_cases()) {
      const std::vector<double>& v = std::string(c.name) == "gelu tanh" ? finite : with_inf;
      const Tensor x = from_buffer(v.data(), {static_cast<std::int64_t>(v.size())}, DType::f64, dtype);
      compare_with_cpu(std::string(c.name) + " special values " + std::string(dtype_name(dtype)), {x}, {false},
                       [&](const std::vector<Tensor>& in) { return c.fn(in[0]); }, tolerance(dtype), 0);
    }
  }
}

// ---- in place ----

TEST(CudaElementwiseOps, InPlaceAddAndMulMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 5000;
  for (DType dtype : kFloatDtypes) {
    struct Case {
      Shape self, other;
      bool transpose_self;
    };
    const Case cases[] = {{{4, 3, 5}, {3, 1}, false}, {{70001}, {70001}, false}, {{}, {}, false},
                          {{2, 3}, {}, false},        {{9, 7}, {9}, true},        {{0, 4}, {4}, false}};
    for (const Case& c : cases) {
      const std::string what = name_of(dtype, c.self) + " += " + shape_str(c.other);
      SCOPED_TRACE(what);
      const Tensor self = random_uniform(c.self, dtype, ++seed), other = random_uniform(c.other, dtype, ++seed);
      Tensor want = self.clone(), got = self.to(kCuda);
      if (c.transpose_self) want = want.t(), got = got.t();
      ops::add_(want, c.transpose_self ? other.t() : other);
      ops::add_(got, (c.transpose_self ? other.t() : other).to(kCuda));
      expect_close(got, want, tolerance(dtype), "add_");
      ops::mul_(want, -0.7);
      ops::mul_(got, -0.7);
      expect_close(got, want, tolerance(dtype), "mul_");
      ops::add_(want, want);  // other is self: read before written by the same thread
      ops::add_(got, got);
      expect_close(got, want, tolerance(dtype), "add_ self");
    }
  }
}

// ---- where, masked_fill, comparisons ----

TEST(CudaElementwiseOps, WhereAndMaskedFillMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 6000;
  struct Case {
    Shape cond, a, b;
  };
  const Case cases[] = {{{4, 1, 5}, {3, 1}, {5}}, {{}, {}, {}}, {{70001}, {70001}, {}}, {{0, 2}, {2}, {1}},
                        {{257, 301}, {301}, {257, 1}}};
  for (DType dtype : kFloatDtypes) {
    for (const Case& c : cases) {
      const Tensor cond = random_mask(c.cond, ++seed);
      const Tensor a = random_uniform(c.a, dtype, ++seed), b = random_uniform(c.b, dtype, ++seed);
      // Not bitwise: the gradients sum over broadcast dims, in another order on the device.
      compare_with_cpu("where " + name_of(dtype, c.cond) + " " + shape_str(c.a) + " " + shape_str(c.b), {cond, a, b},
                       {false, true, true},
                       [](const std::vector<Tensor>& in) { return ops::where(in[0], in[1], in[2]); },
                       tolerance(dtype), seed);
    }
    const Tensor x = random_uniform({4, 3, 5}, dtype, ++seed), mask = random_mask({3, 1}, ++seed);
    compare_with_cpu("masked_fill " + name_of(dtype, {4, 3, 5}), {x, mask}, {true, false},
                     [](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], in[1], -1e4); }, 0.0, seed);
    const Tensor big = random_uniform({33, 65}, dtype, ++seed), big_mask = random_mask({65, 33}, ++seed);
    compare_with_cpu("masked_fill transposed " + name_of(dtype, {33, 65}), {big, big_mask}, {true, false},
                     [](const std::vector<Tensor>& in) { return ops::masked_fill(in[0].t(), in[1], 2.5); }, 0.0,
                     seed);
  }
  // Integer values move bit for bit too (no gradient).
  for (DType dtype : {DType::i32, DType::i64, DType::u8, DType::boolean}) {
    const Tensor cond = random_mask({4, 1, 5}, ++seed);
    const Tensor a = random_small_ints({3, 1}, dtype, ++seed, 2), b = random_small_ints({5}, dtype, ++seed, 2);
    compare_with_cpu("where " + std::string(dtype_name(dtype)), {cond, a, b}, {false, false, false},
                     [](const std::vector<Tensor>& in) { return ops::where(in[0], in[1], in[2]); }, 0.0, seed);
  }
}

TEST(CudaElementwiseOps, ComparisonsMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 7000;
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f8_e4m3,
                          DType::i8,  DType::u8,   DType::i32, DType::i64};
  for (DType dtype : dtypes) {
    for (const Shape& shape : kUnaryShapes) {
      const Tensor x = random_small_ints(shape, dtype, ++seed, 4);
      for (double s : {1.0, 1.5, -0.5}) {
        const std::string what = name_of(dtype, shape) + " s=" + std::to_string(s);
        compare_with_cpu("gt " + what, {x}, {false}, [s](const std::vector<Tensor>& in) { return ops::gt(in[0], s); },
                         0.0, seed);
        compare_with_cpu("lt " + what, {x}, {false}, [s](const std::vector<Tensor>& in) { return ops::lt(in[0], s); },
                         0.0, seed);
      }
    }
    const Tensor m = random_small_ints({20, 9}, dtype, ++seed, 4);
    compare_with_cpu("gt transposed " + name_of(dtype, {20, 9}), {m}, {false},
                     [](const std::vector<Tensor>& in) { return ops::gt(in[0].t(), 1.0); }, 0.0, seed);
  }
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f8_e5m2, DType::i8, DType::u8,
                      DType::i32, DType::i64, DType::boolean}) {
    for (const BinaryShapes& s : kBinaryShapes) {
      const Tensor a = random_small_ints(s.a, dtype, ++seed, 2), b = random_small_ints(s.b, dtype, ++seed, 2);
      compare_with_cpu("eq " + name_of(dtype, s.a) + " x " + shape_str(s.b), {a, b}, {false, false},
                       [](const std::vector<Tensor>& in) { return ops::eq(in[0], in[1]); }, 0.0, seed);
    }
  }
}

// ---- errors ----

TEST(CudaElementwiseOps, MixedDevicesThrow) {
  SKIP_WITHOUT_DEVICE();
  const Tensor c = random_uniform({3}, DType::f32, 1), d = c.to(kCuda);
  EXPECT_THROW(ops::add(c, d), Error);
  EXPECT_THROW(ops::mul(d, c), Error);
  EXPECT_THROW(ops::where(random_mask({3}, 2), d, d), Error);
  EXPECT_THROW(ops::eq(d, c), Error);
  Tensor dd = d.clone();
  EXPECT_THROW(ops::add_(dd, c), Error);
  EXPECT_THROW(ops::add(d, random_uniform({4}, DType::f32, 3).to(kCuda)), Error);  // shapes do not broadcast
  EXPECT_THROW(ops::exp(Tensor::empty({3}, DType::i32, kCuda)), Error);            // not a float dtype
}

// Argument errors throw before any device is touched, with or without CUDA or a device.
TEST(CudaElementwiseOps, EntryPointsRejectBadArguments) {
  const std::int64_t shape[] = {4}, bad_shape[] = {-1}, strides[] = {1};
  char buf[64] = {};
  EXPECT_THROW(cuda::elementwise_unary(cuda::UnaryOp::exp, buf, buf, strides, shape, 1, DType::i32, 0, 0, 0), Error);
  EXPECT_THROW(cuda::elementwise_binary(cuda::BinaryOp::add, buf, buf, strides, buf, strides, bad_shape, 1,
                                        DType::f32, 0, 0, 0),
               Error);
  EXPECT_THROW(cuda::where(buf, buf, strides, buf, strides, buf, strides, shape, 1, 3, 0), Error);
  EXPECT_THROW(cuda::compare_scalar(cuda::CompareOp::gt, buf, buf, strides, shape, 1, DType::boolean, 0, 0), Error);
  EXPECT_THROW(cuda::eq(buf, buf, strides, buf, strides, shape, 1, DType::f8_e4m3, 0), Error);
}

// Without a usable device (or without CUDA) the entry points say so instead of touching memory.
TEST(CudaElementwiseOps, EntryPointsThrowWithoutDevice) {
  if (cuda::is_available()) GTEST_SKIP() << "a device is available";
  const std::int64_t shape[] = {4}, strides[] = {1};
  char buf[64] = {};
  try {
    cuda::elementwise_unary(cuda::UnaryOp::exp, buf, buf, strides, shape, 1, DType::f32, 0, 0, 0);
    ADD_FAILURE() << "expected memtrain::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda::elementwise_unary"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memtrain
