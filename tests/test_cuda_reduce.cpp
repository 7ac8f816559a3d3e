// CUDA reductions (src/cuda/reduce.h and ops::sum / mean / max / argmax / sum_to on cuda:0) against
// the CPU: the raw kernels over every thread mapping (rows by warp and by block, columns, chunked long
// axes, empty axes) with poisoned outputs, and the ops end to end through autograd.
// Tolerances, and why:
//   sum: both devices add the same values in f64 and round once to the dtype; only the order of the f64
//     additions differs (error ~1e-16 of sum |x|), so results are equal or one rounding apart:
//     |got - want| <= ulp(dtype) * |want| + 1e-12 * sum |x|.
//   mean: sum rounded to the dtype then divided as on the CPU: one more rounding, same bound doubled.
//   max / argmax: exact (a selection; the index rule is the CPU's: first maximum, first NaN).
//   gradients: exact for sum and max (copies of the output gradient), one division for mean.
// Device tests skip without a usable device; the argument checks run on any CUDA build (they throw before
// the device is touched), and a build without CUDA throws "built without CUDA".
#include "memtrain/autograd/engine.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"
#include "cuda/device_ops.h"
#include "cuda/reduce.h"
#include "memtrain/ops/reduce.h"

#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

#define SKIP_WITHOUT_DEVICE()                                              \
  do {                                                                     \
    if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason(); \
  } while (0)

const Device kCuda = Device::cuda(0);
const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Relative size of one rounding in dtype (an ulp at 1, which bounds the relative error of one rounding).
double ulp(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 0x1p-7;
    case DType::f16: return 0x1p-10;
    case DType::f64: return 0x1p-52;
    default: return 0x1p-23;
  }
}

// ---- inputs and reading back ----

Tensor from_doubles(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return from_buffer(v.data(), shape, DType::f64, dtype);
}

// Normal values rounded to dtype, seeded per call; `shift` moves the mean so sums are not ~0.
Tensor random_normal(const Shape& shape, DType dtype, std::uint64_t seed, double shift = 0.25) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(shift, 1.0);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (double& x : v) x = dist(rng);
  return from_doubles(v, shape, dtype);
}

// Small integers (many ties), with NaN, +-Inf and -0 sprinkled in when `specials`.
Tensor random_ties(const Shape& shape, DType dtype, std::uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3), pick(0, 99);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (double& x : v) {
    x = small(rng);
    const int p = pick(rng);
    if (specials && p < 2) x = kNan;
    else if (specials && p < 4) x = p == 2 ? kInf : -kInf;
    else if (p < 10) x = -0.0;
  }
  return from_doubles(v, shape, dtype);
}

std::vector<double> host_values(const Tensor& t) {
  Tensor h = t.detach();
  if (h.device().is_cuda()) h = h.to(Device::cpu());
  h = h.to(DType::f64).contiguous();
  const double* p = h.data<double>();
  return std::vector<double>(p, p + h.numel());
}

// Sum of |x| over the reduced elements of each output, broadcast to one number: the scale of the f64
// rounding noise (the largest over outputs is a safe bound for all).
double abs_sum(const Tensor& x) {
  double s = 0;
  for (double v : host_values(x))
    if (std::isfinite(v)) s += std::fabs(v);
  return s;
}

// Elementwise |got - want| <= rtol |want| + atol; NaN exactly where want is NaN; infinities equal.
void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  EXPECT_TRUE(got.device().is_cuda()) << what << " is on " << got.device().str();
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = host_values(got), w = host_values(want);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    bool ok;
    if (std::isnan(w[i])) ok = std::isnan(g[i]);
    else if (std::isinf(w[i])) ok = g[i] == w[i];
    else ok = std::isfinite(g[i]) && std::fabs(g[i] - w[i]) <= rtol * std::fabs(w[i]) + atol;
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.size() << " elements differ, first at " << first
                     << " (got " << (bad ? g[first] : 0.0) << ", want " << (bad ? w[first] : 0.0) << ")";
}

void expect_identical(const Tensor& got, const Tensor& want, const std::string& what) {
  expect_close(got, want, 0.0, 0.0, what);
}

// Leaves the next device allocations of these byte sizes 0xFF-filled (NaN in every float dtype, -1 in
// i64): allocate, fill, free to the cache. So an output element a kernel never writes shows up.
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

void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected memtrain::Error mentioning " << needles.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << msg << "' lacks '" << n << "'";
  }
}

std::string name_of(DType dtype, const Shape& shape) { return std::string(dtype_name(dtype)) + " " + shape_str(shape); }

// ---- the raw kernels ----

struct Layout {
  std::int64_t outer, reduce, inner;
};
std::string layout_str(const Layout& l) {
  return "(" + std::to_string(l.outer) + ", " + std::to_string(l.reduce) + ", " + std::to_string(l.inner) + ")";
}

// Every thread mapping of reduce_dims.cu: rows by warp / by block, chunked rows (few, long), columns,
// chunked columns, size-1 axes, and an empty reduce axis.
const Layout kSumLayouts[] = {{1, 1, 1},    {300, 33, 1},  {37, 4097, 1}, {1, 5000, 1},  {1, 1 << 20, 1},
                              {3, 1000, 7}, {2, 70000, 2}, {64, 5, 129},  {5000, 3, 4},  {1, 0, 5},
                              {4, 0, 1},    {1, 9, 1},     {1, 3000, 65}};

TEST(CudaReduceKernels, SumDimMatchesCpuWithPoisonedOutputs) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 1;
  for (const Layout& l : kSumLayouts) {
    for (DType dtype : kDtypes) {
      const std::string what = std::string(dtype_name(dtype)) + " " + layout_str(l);
      SCOPED_TRACE(what);
      const Shape shape = {l.outer, l.reduce, l.inner};
      const Tensor x = random_normal(shape, dtype, ++seed);
      const Tensor want = ops::sum(x, {1});  // CPU reference, (outer, inner)
      const Tensor xd = x.to(kCuda);
      const std::size_t out_bytes = static_cast<std::size_t>(l.outer * l.inner) * dtype_size(dtype);
      DeviceBuffer out(out_bytes);
      upload(out.get(), std::vector<std::uint8_t>(out_bytes, 0xff));
      cuda::sum_dim(xd.numel() == 0 ? nullptr : xd.data_ptr(), out.get(), dtype, l.outer, l.reduce, l.inner, 0);
      Tensor got = Tensor::empty(want.shape(), dtype, kCuda);
      cuda::copy(got.data_ptr(), kCuda, out.get(), kCuda, out_bytes);
      expect_close(got, want, ulp(dtype), 1e-12 * abs_sum(x), what);
      // Deterministic: a second run gives the same bits.
      DeviceBuffer again(out_bytes);
      cuda::sum_dim(xd.numel() == 0 ? nullptr : xd.data_ptr(), again.get(), dtype, l.outer, l.reduce, l.inner, 0);
      EXPECT_EQ(download<std::uint8_t>(out.get(), out_bytes), download<std::uint8_t>(again.get(), out_bytes));
    }
  }
}

TEST(CudaReduceKernels, SumOfSquaresMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t n : {0, 1, 31, 1000, 4097, 3000001}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
      const Tensor x = random_normal({n}, dtype, static_cast<std::uint64_t>(n) + 7);
      double want = 0;
      for (double v : host_values(x)) want += v * v;  // exact squares of the dtype values, f64 sum
      const Tensor xd = x.to(kCuda);
      DeviceBuffer out(sizeof(double));
      upload(out.get(), std::vector<double>{kNan});
      cuda::sum_of_squares(n == 0 ? nullptr : xd.data_ptr(), dtype, static_cast<std::size_t>(n),
                           out.at<double>(), 0);
      const double got = download<double>(out.get(), 1)[0];
      EXPECT_NEAR(got, want, 1e-12 * want) << "f64 sums in different orders";
    }
  }
}

// Layouts for max: rows by warp and by block, columns, one element, a single column of one row.
const Layout kMaxLayouts[] = {{7, 5, 1}, {3, 5000, 1}, {4, 100, 3}, {1, 1, 1}, {2, 33, 64}, {300, 2, 1}, {1, 700, 1}};

TEST(CudaReduceKernels, MaxDimMatchesCpuWithTiesAndNan) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 100;
  for (const Layout& l : kMaxLayouts) {
    for (DType dtype : kDtypes) {
      for (bool specials : {false, true}) {
        const std::string what = std::string(dtype_name(dtype)) + " " + layout_str(l) + (specials ? " nan/inf" : "");
        SCOPED_TRACE(what);
        const Tensor x = random_ties({l.outer, l.reduce, l.inner}, dtype, ++seed, specials);
        const Tensor want_v = ops::max(x, 1), want_i = ops::argmax(x, 1);
        const Tensor xd = x.to(kCuda);
        const std::size_t m = static_cast<std::size_t>(l.outer * l.inner);
        DeviceBuffer values(m * dtype_size(dtype)), indices(m * sizeof(std::int64_t)), only(m * sizeof(std::int64_t));
        upload(values.get(), std::vector<std::uint8_t>(m * dtype_size(dtype), 0xff));
        upload(indices.get(), std::vector<std::int64_t>(m, -7));
        upload(only.get(), std::vector<std::int64_t>(m, -7));
        cuda::max_dim(xd.data_ptr(), values.get(), indices.at<std::int64_t>(), dtype, l.outer, l.reduce, l.inner, 0);
        cuda::max_dim(xd.data_ptr(), nullptr, only.at<std::int64_t>(), dtype, l.outer, l.reduce, l.inner, 0);
        Tensor got_v = Tensor::empty(want_v.shape(), dtype, kCuda);
        cuda::copy(got_v.data_ptr(), kCuda, values.get(), kCuda, m * dtype_size(dtype));
        expect_identical(got_v, want_v, what + " values");
        const std::vector<std::int64_t> got_i = download<std::int64_t>(indices.get(), m);
        const std::vector<std::int64_t> got_only = download<std::int64_t>(only.get(), m);
        const std::int64_t* w = want_i.data<std::int64_t>();
        for (std::size_t k = 0; k < m; ++k) {
          EXPECT_EQ(got_i[k], w[k]) << what << " index " << k;
          EXPECT_EQ(got_only[k], w[k]) << what << " index-only " << k;
        }
      }
    }
  }
}

TEST(CudaReduceKernels, ArgumentErrorsThrowBeforeTheDevice) {
  std::vector<std::int64_t> host(4);
  float f = 0;
  if (!cuda::built_with_cuda()) {
    expect_error([&] { cuda::sum_dim(&f, &f, DType::f32, 1, 1, 1, 0); }, {"cuda::sum_dim", "without CUDA"});
    expect_error([&] { cuda::max_dim(&f, &f, nullptr, DType::f32, 1, 1, 1, 0); }, {"cuda::max_dim", "without CUDA"});
    expect_error([&] { cuda::sum_of_squares(&f, DType::f32, 1, nullptr, 0); }, {"cuda::sum_of_squares", "without CUDA"});
    return;
  }
  // Host pointers are fine here: each call throws before reading them.
  expect_error([&] { cuda::sum_dim(&f, &f, DType::i64, 1, 1, 1, 0); }, {"cuda::sum_dim", "i64", "not supported"});
  expect_error([&] { cuda::sum_dim(&f, &f, DType::f32, 1, -1, 1, 0); }, {"cuda::sum_dim", "negative"});
  expect_error([&] { cuda::sum_dim(nullptr, &f, DType::f32, 1, 3, 1, 0); }, {"cuda::sum_dim", "null"});
  expect_error([&] { cuda::sum_dim(&f, &f, DType::f32, std::int64_t(1) << 40, std::int64_t(1) << 40, 1, 0); },
               {"cuda::sum_dim", "too large"});
  expect_error([&] { cuda::max_dim(&f, nullptr, nullptr, DType::f32, 1, 1, 1, 0); }, {"cuda::max_dim", "both null"});
  expect_error([&] { cuda::max_dim(&f, &f, host.data(), DType::f32, 2, 0, 2, 0); }, {"cuda::max_dim", "empty axis"});
  expect_error([&] { cuda::max_dim(&f, &f, host.data(), DType::u8, 1, 1, 1, 0); }, {"cuda::max_dim", "u8"});
  expect_error([&] { cuda::sum_of_squares(&f, DType::i32, 1, nullptr, 0); }, {"cuda::sum_of_squares", "i32"});
  expect_error([&] { cuda::sum_of_squares(&f, DType::f32, 1, nullptr, 0); }, {"cuda::sum_of_squares", "null"});
}

// ---- the ops on cuda:0 ----

struct SumCase {
  Shape shape;
  Shape dims;  // empty: all dims
  bool keepdim;
};

// Full reduce, each single dim (first / middle / last), two non-adjacent dims, negative dims, keepdim
// both ways, rows longer than 4096, size-1 dims mixed in, empty reduced extents, a 0-d input.
const SumCase kSumCases[] = {
    {{4, 3, 5}, {}, false},       {{4, 3, 5}, {}, true},         {{4, 3, 5}, {0}, false},
    {{4, 3, 5}, {1}, true},       {{4, 3, 5}, {2}, false},       {{4, 3, 5}, {-1}, true},
    {{4, 3, 5}, {0, 2}, false},   {{4, 3, 5}, {2, 0}, true},     {{5, 6, 7, 8}, {1, 3}, false},
    {{5, 6, 7, 8}, {0, 2}, true}, {{5, 6, 7, 8}, {1, 2}, false}, {{3, 5000}, {1}, false},
    {{2, 4097}, {-1}, true},      {{4097, 3}, {0}, false},       {{6, 1, 7, 1}, {1, 2}, false},
    {{6, 1, 7}, {0, 1}, true},    {{0, 3}, {0}, false},          {{3, 0}, {1}, true},
    {{3, 0, 2}, {0}, false},      {{}, {}, false},               {{}, {0}, true},
    {{1 << 20}, {0}, false},      {{2, 300, 700}, {0, 1}, false}};

// Runs f on a CPU leaf and a cuda:0 copy; compares the outputs, then the input gradients after
// backward(w) with one random w.
void compare_op(const std::string& what, const Tensor& x, const std::function<Tensor(const Tensor&)>& f, double rtol,
                double atol, bool grads) {
  SCOPED_TRACE(what);
  Tensor c = x.detach(), d = x.detach().to(kCuda);
  if (grads) {
    c.set_requires_grad(true);
    d.set_requires_grad(true);
  }
  const Tensor y_cpu = f(c);
  poison_device_cache({y_cpu.nbytes(), x.nbytes()});
  const Tensor y_dev = f(d);
  expect_close(y_dev, y_cpu, rtol, atol, what + " output");
  if (!grads) return;
  const Tensor w = random_normal(y_cpu.shape(), y_cpu.dtype(), 0x5eed + y_cpu.numel());
  y_cpu.backward(w);
  poison_device_cache({x.nbytes()});
  y_dev.backward(w.to(kCuda));
  expect_close(d.grad(), c.grad(), rtol, atol, what + " gradient");
}

TEST(CudaReduceOps, SumMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 1000;
  for (const SumCase& sc : kSumCases) {
    for (DType dtype : kDtypes) {
      const Tensor x = random_normal(sc.shape, dtype, ++seed);
      const std::string what = name_of(dtype, sc.shape) + " dims " + shape_str(sc.dims) + (sc.keepdim ? " keepdim" : "");
      compare_op(what, x, [&](const Tensor& t) { return ops::sum(t, sc.dims, sc.keepdim); }, ulp(dtype),
                 1e-12 * abs_sum(x), dtype != DType::f64);
    }
  }
  const Tensor x = random_normal({}, DType::f32, 5);
  compare_op("sum(a) of a scalar", x, [](const Tensor& t) { return ops::sum(t); }, 0, 0, true);
  const Tensor y = random_normal({37, 1000}, DType::bf16, 6);
  compare_op("sum(a) of a matrix", y, [](const Tensor& t) { return ops::sum(t); }, ulp(DType::bf16),
             1e-12 * abs_sum(y), true);
}

TEST(CudaReduceOps, SumOfStridedInputsMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor x = random_normal({33, 65, 4}, dtype, 77);
    const double atol = 1e-12 * abs_sum(x);
    // Transposed, permuted, sliced and expanded views: the CUDA path packs them (or reads them in place
    // when contiguous after all).
    compare_op(name_of(dtype, x.shape()) + " transposed, dim 0",
               x, [](const Tensor& t) { return ops::sum(t.transpose(0, 1), {0}); }, ulp(dtype), atol, true);
    compare_op(name_of(dtype, x.shape()) + " permuted, dims {1, 2}",
               x, [](const Tensor& t) { return ops::sum(t.permute({2, 0, 1}), {1, 2}, true); }, ulp(dtype), atol,
               true);
    compare_op(name_of(dtype, x.shape()) + " sliced, dim 1",
               x, [](const Tensor& t) { return ops::sum(t.slice(1, 3, 60, 2), {1}); }, ulp(dtype), atol, true);
    compare_op(name_of(dtype, x.shape()) + " expanded, dim 0",
               x, [](const Tensor& t) { return ops::sum(t.unsqueeze(0).expand({5, 33, 65, 4}), {0, 3}); },
               2 * ulp(dtype), 5 * atol, true);
  }
}

// mean = sum / count on the CPU: the CUDA path needs the scalar div of the elementwise backend too.
TEST(CudaReduceOps, MeanMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 2000;
  for (const SumCase& sc : kSumCases) {
    if (sc.shape.size() > 0 && shape_numel(sc.shape) == 0) continue;  // 0 / 0: covered by MeanOfNothingIsNan
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      const Tensor x = random_normal(sc.shape, dtype, ++seed);
      const std::string what = name_of(dtype, sc.shape) + " dims " + shape_str(sc.dims) + (sc.keepdim ? " keepdim" : "");
      compare_op(what, x, [&](const Tensor& t) { return ops::mean(t, sc.dims, sc.keepdim); }, 2 * ulp(dtype),
                 1e-12 * abs_sum(x), true);
    }
  }
}

TEST(CudaReduceOps, MeanOfNothingIsNan) {
  SKIP_WITHOUT_DEVICE();
  const Tensor x = Tensor::empty({0, 3}, DType::f32, kCuda);
  const std::vector<double> got = host_values(ops::mean(x, {0}));
  ASSERT_EQ(got.size(), 3u);
  for (double v : got) EXPECT_TRUE(std::isnan(v));
  const std::vector<double> sums = host_values(ops::sum(x, {0}));
  for (double v : sums) EXPECT_EQ(v, 0.0);
}

TEST(CudaReduceOps, MaxAndArgmaxMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  const Shape shapes[] = {{4, 3, 5}, {7, 5000}, {4097, 3}, {2, 33, 64}, {9}, {1, 1}};
  std::uint64_t seed = 3000;
  for (const Shape& shape : shapes) {
    for (DType dtype : kDtypes) {
      for (bool specials : {false, true}) {
        const Tensor x = random_ties(shape, dtype, ++seed, specials);
        for (std::int64_t dim = -static_cast<std::int64_t>(shape.size()); dim < static_cast<std::int64_t>(shape.size());
             ++dim) {
          for (bool keepdim : {false, true}) {
            const std::string what = name_of(dtype, shape) + " dim " + std::to_string(dim) +
                                     (keepdim ? " keepdim" : "") + (specials ? " nan/inf" : "");
            // Gradients (one-hot through eq/where) only where the values are finite: NaN * 0 muddles them.
            const bool grads = !specials && dtype != DType::f64;
            compare_op(what + " max", x, [&](const Tensor& t) { return ops::max(t, dim, keepdim); }, 0, 0, grads);
            compare_op(what + " argmax", x, [&](const Tensor& t) { return ops::argmax(t, dim, keepdim); }, 0, 0,
                       false);
          }
        }
      }
    }
  }
  // A transposed view, and a 0-d input.
  const Tensor y = random_ties({6, 300}, DType::f32, 31, true);
  compare_op("transposed max", y, [](const Tensor& t) { return ops::max(t.t(), 1); }, 0, 0, false);
  compare_op("transposed argmax", y, [](const Tensor& t) { return ops::argmax(t.t(), 0, true); }, 0, 0, false);
  const Tensor s = random_normal({}, DType::f32, 32);
  compare_op("0-d max", s, [](const Tensor& t) { return ops::max(t, 0); }, 0, 0, true);
  compare_op("0-d argmax", s, [](const Tensor& t) { return ops::argmax(t, -1); }, 0, 0, false);
}

TEST(CudaReduceOps, MaxTieAndNanRulesAreTheCpus) {
  SKIP_WITHOUT_DEVICE();
  // Rows: ties (first wins), NaN after the max (NaN wins), two NaNs (first wins), -0 before +0 (first wins),
  // all -Inf (index 0). Long rows (5000) take the block kernel, short ones the warp kernel.
  for (std::int64_t n : {5, 5000}) {
    std::vector<double> v(static_cast<std::size_t>(5 * n), -1.0);
    auto at = [&](std::int64_t r, std::int64_t c) -> double& { return v[static_cast<std::size_t>(r * n + c)]; };
    at(0, 1) = 3, at(0, 3) = 3, at(0, n - 1) = 3;
    at(1, 0) = 2, at(1, n - 2) = kNan;
    at(2, 2) = kNan, at(2, 4) = kNan, at(2, 3) = kInf;
    for (std::int64_t c = 0; c < n; ++c) at(3, c) = c == 1 ? -0.0 : c == 2 ? 0.0 : -1.0, at(4, c) = -kInf;
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Tensor x = from_doubles(v, {5, n}, dtype);
      const std::vector<double> idx = host_values(ops::argmax(x.to(kCuda), 1));
      EXPECT_EQ(idx, (std::vector<double>{1, static_cast<double>(n - 2), 2, 1, 0})) << dtype_name(dtype) << " n=" << n;
      const std::vector<double> val = host_values(ops::max(x.to(kCuda), 1));
      EXPECT_EQ(val[0], 3.0);
      EXPECT_TRUE(std::isnan(val[1]) && std::isnan(val[2]));
      EXPECT_TRUE(val[3] == 0.0 && std::signbit(val[3])) << "the first of -0 and +0";
      EXPECT_EQ(val[4], -kInf);
      // The same along dim 0 of the transpose (the column kernel).
      const Tensor xt = x.t().contiguous().to(kCuda);
      EXPECT_EQ(host_values(ops::argmax(xt, 0)), idx);
    }
  }
}

TEST(CudaReduceOps, SumToMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const Shape targets[] = {{3, 1}, {5}, {}, {1, 3, 1}, {4, 1, 5}, {1}, {3, 5}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor x = random_normal({4, 3, 5}, dtype, 4000);
    for (const Shape& target : targets) {
      compare_op(name_of(dtype, x.shape()) + " to " + shape_str(target), x,
                 [&](const Tensor& t) { return ops::sum_to(t, target); }, ulp(dtype), 1e-12 * abs_sum(x), true);
    }
  }
  // The bias gradient of a linear layer: [B*T, C] -> [C], columns of a long reduce axis.
  const Tensor g = random_normal({4099, 96}, DType::bf16, 4001);
  compare_op("bias gradient", g, [](const Tensor& t) { return ops::sum_to(t, {96}); }, ulp(DType::bf16),
             1e-12 * abs_sum(g), true);
}

TEST(CudaReduceOps, RefusalsAreClear) {
  SKIP_WITHOUT_DEVICE();
  const Tensor empty_rows = Tensor::empty({3, 0}, DType::f32, kCuda);
  expect_error([&] { ops::max(empty_rows, 1); }, {"max", "size 0"});
  expect_error([&] { ops::argmax(empty_rows, -1); }, {"argmax", "size 0"});
  const Tensor ints = zeros({2, 3}, DType::i64, kCuda);
  expect_error([&] { ops::sum(ints, {0}); }, {"sum", "i64"});
  expect_error([&] { ops::argmax(ints, 0); }, {"argmax", "i64"});
  expect_error([&] { ops::sum(zeros({2, 3}, DType::f32, kCuda), {2}); }, {"sum", "out of range"});
  expect_error([&] { ops::sum_to(zeros({2, 3}, DType::f32, kCuda), {4}); }, {"sum_to", "not a broadcast"});
  // Max over a non-empty dim of a tensor with another empty dim is fine: an empty result.
  const Tensor none = ops::max(Tensor::empty({0, 4}, DType::f32, kCuda), 1);
  EXPECT_EQ(shape_str(none.shape()), shape_str(Shape{0}));
}

}  // namespace
}  // namespace memtrain
