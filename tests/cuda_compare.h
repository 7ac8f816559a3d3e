// Helpers of the CUDA-vs-CPU tests that need no private CUDA header, so a test built without CUDA can use them
// (its device cases then skip): random inputs, device-result comparisons with stated tolerances, and the
// tensor-level run of an op on the CPU and on cuda:0 (compare_with_cpu). Shared by tests/test_cuda_ops.cpp,
// tests/test_cuda_nn.cpp and tests/test_norm.cpp.
#pragma once

#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

// Skips the test, naming why, when no CUDA device is usable (a CUDA tensor cannot exist without one).
#define SKIP_WITHOUT_DEVICE()                                                                      \
  do {                                                                                             \
    if (!::memtrain::cuda::is_available()) GTEST_SKIP() << ::memtrain::cuda::unavailable_reason(); \
  } while (0)

namespace memtrain::test_support {

const Device kCuda = Device::cuda(0);

// ---- host values: bf16 rounding and random inputs ----

inline std::uint16_t bf16_bits(float f) {  // round to nearest even
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_value(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }
inline float round_bf16(float f) { return bf16_value(bf16_bits(f)); }

// Uniform in [lo, hi), rounded to bf16 values when dtype is bf16.
inline std::vector<float> random_values(DType dtype, std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dtype == DType::bf16 ? round_bf16(dist(rng)) : dist(rng);
  return v;
}

inline Tensor from_floats(const std::vector<float>& v, const Shape& shape, DType dtype) {
  return from_buffer(v.data(), shape, DType::f32, dtype);
}

// Normal(shift, scale^2) values (rounded to dtype on the CPU), seeded per call.
inline Tensor random_normal(const Shape& shape, DType dtype, std::uint64_t seed, float scale = 1.0f,
                            float shift = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(shift, scale);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return from_floats(v, shape, dtype);
}

inline Tensor random_uniform(const Shape& shape, DType dtype, std::uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return from_floats(v, shape, dtype);
}

// ---- comparing host vectors: per element, or bit for bit ----

// |got - want| <= atol + rtol |want| elementwise; NaN only where want is NaN. Reports the worst element.
struct Tol {
  double rtol, atol;
};
// extra: per-element absolute tolerance added to the bound (optional).
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, Tol tol,
                         const std::string& what, const std::vector<double>* extra = nullptr) {
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
inline void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && wrong++ == 0) first = i;
  }
  EXPECT_EQ(wrong, 0u) << what << ": first difference at " << first << ": " << got[first] << " vs " << want[first];
}

const Tol kF32{1e-5, 1e-5};
const Tol kBF16{1e-2, 1e-2};
inline Tol tol_for(DType dtype) { return dtype == DType::f32 ? kF32 : kBF16; }

struct Shape2 {
  std::int64_t rows, cols;
};

// ---- comparing tensors normwise, and running an op on both devices ----

// Every element of t (CPU, or contiguous on a device) widened to double, row-major.
inline std::vector<double> host_values(const Tensor& t) {
  Tensor h = t.detach();
  if (h.device().is_cuda()) h = h.to(Device::cpu());
  h = h.to(DType::f64).contiguous();
  const double* p = h.data<double>();
  return std::vector<double>(p, p + h.numel());
}

// ||got - want|| / max(||want||, floor * sqrt(n)) <= tol over the elements where want is not NaN; got NaN
// exactly there. The floor (an RMS magnitude) serves results that are tiny differences of large terms,
// where CPU and CUDA are both only accurate relative to the terms.
inline void expect_normwise(const Tensor& got, const Tensor& want, double tol, const std::string& what,
                            double floor = 0.0) {
  ASSERT_TRUE(got.defined()) << what << ": no CUDA result";
  ASSERT_TRUE(want.defined()) << what << ": no CPU result";
  EXPECT_TRUE(got.device().is_cuda()) << what << " is on " << got.device().str();
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = host_values(got), w = host_values(want);
  double diff2 = 0, ref2 = 0;
  std::size_t nan_mismatch = 0, first_bad = g.size();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      if (!std::isnan(g[i])) ++nan_mismatch, first_bad = std::min(first_bad, i);
      continue;
    }
    if (!std::isfinite(g[i])) ++nan_mismatch, first_bad = std::min(first_bad, i);
    diff2 += (g[i] - w[i]) * (g[i] - w[i]);
    ref2 += w[i] * w[i];
  }
  EXPECT_EQ(nan_mismatch, 0u) << what << ": NaN/Inf mismatches, first at " << first_bad << " (got "
                              << (first_bad < g.size() ? g[first_bad] : 0.0) << ", want "
                              << (first_bad < w.size() ? w[first_bad] : 0.0) << ")";
  const double scale = std::max(std::sqrt(ref2), floor * std::sqrt(static_cast<double>(g.size())));
  const double err = scale > 0 ? std::sqrt(diff2) / scale : std::sqrt(diff2);
  EXPECT_LE(err, tol) << what << ": normwise error over " << g.size() << " elements";
}

// Leaves the next device allocations of these byte sizes 0xFF-filled: allocate, fill, free to the cache.
inline void poison_device_cache(const std::vector<std::size_t>& sizes) {
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

struct Tolerance {
  double out, grad;
  double grad_floor = 0.0;  // see expect_normwise
};
inline Tolerance tolerance(DType dtype) { return dtype == DType::f32 ? Tolerance{2e-5, 1e-4} : Tolerance{1e-2, 1e-2}; }

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs f on CPU leaves made from `inputs` (undefined entries stay undefined; entry i requires grad when
// grad[i]) and on cuda:0 copies of them; compares the outputs, then backward with one random gradient and
// every requested input gradient.
inline void compare_with_cpu(const std::string& what, const std::vector<Tensor>& inputs, const std::vector<bool>& grad,
                             const OpFn& f, Tolerance tol, std::uint64_t seed) {
  SCOPED_TRACE(what);
  ASSERT_EQ(inputs.size(), grad.size());
  std::vector<Tensor> on_cpu, on_dev;
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor c, d;
    if (inputs[i].defined()) {
      c = inputs[i].detach();
      d = inputs[i].detach().to(kCuda);
      if (grad[i]) {
        c.set_requires_grad(true);
        d.set_requires_grad(true);
      }
      sizes.push_back(inputs[i].nbytes());
    }
    on_cpu.push_back(c);
    on_dev.push_back(d);
  }
  const Tensor y_cpu = f(on_cpu);
  sizes.push_back(y_cpu.nbytes());
  poison_device_cache(sizes);
  const Tensor y_dev = f(on_dev);
  expect_normwise(y_dev, y_cpu, tol.out, "output");

  bool any_grad = false;
  for (bool g : grad) any_grad = any_grad || g;
  if (!any_grad) return;
  const Tensor w = random_normal(y_cpu.shape(), y_cpu.dtype(), seed ^ 0x5eed);
  y_cpu.backward(w);
  const Tensor w_dev = w.to(kCuda);
  poison_device_cache(sizes);
  y_dev.backward(w_dev);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!grad[i] || !inputs[i].defined()) continue;
    expect_normwise(on_dev[i].grad(), on_cpu[i].grad(), tol.grad, "gradient of input " + std::to_string(i),
                    tol.grad_floor);
  }
}

inline std::string name_of(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + " " + shape_str(shape);
}

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace memtrain::test_support
