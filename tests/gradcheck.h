// Gradient check by central finite differences, for any differentiable function of tensors.
//
//   expect_gradients_match(f, inputs_f64, atol, rtol)
//
// f maps the inputs to one floating tensor y (any shape). The check reduces y to the scalar
//   L(x) = sum_i y_i * w_i      with fixed random weights w ~ N(0, 1) (the same for every evaluation),
// so one backward pass checks the full vector-Jacobian product in a random direction, not just the sum.
// For every input with requires_grad() set, and every element j of it:
//   numeric_j  = (L(x + eps e_j) - L(x - eps e_j)) / (2 eps),   eps = 1e-6
//   analytic_j = dL/dx_j from backward() (an undefined .grad counts as zeros)
// and the test fails (EXPECT-style, the first few mismatches listed) unless
//   |analytic_j - numeric_j| <= atol + rtol * |numeric_j|.
//
// Rules for callers:
//  - Inputs that require grad must be float64: central differences with eps = 1e-6 lose about
//    |L| * 1e-16 / 1e-6 to rounding, fine in f64 and useless in f32. Other inputs (bool masks, integer
//    indices, f64 constants without requires_grad) are passed to f unchanged and never perturbed.
//  - Each checked input is replaced by a contiguous leaf copy, so the caller's tensors are never
//    modified. To test non-contiguous operands, make the view inside f (e.g. x.t(), x.slice(...),
//    x.expand(...)): the gradient then also flows through the view ops, which are checked with it.
//  - f must be deterministic and smooth within eps of the inputs: keep inputs away from kinks (relu and
//    abs at 0, clamp bounds, ties in max), which random normal values do with overwhelming probability.
//  - L sums over y, so choose atol for the size of y; the defaults suit outputs of up to ~1e4 elements of
//    order 1.
#pragma once

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace memtrain::testing {

namespace gradcheck_detail {

// sum_i y_i * w_i in double, read straight from memory (no ops, so nothing here can mask an op's bug).
inline double weighted_sum(const Tensor& y, const std::vector<double>& w) {
  const Tensor c = y.detach().contiguous();
  const double* p = c.data<double>();
  double s = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) s += p[i] * w[i];
  return s;
}

// Deterministic N(0, 1)-ish weights from a fixed LCG + Box-Muller, independent of the library's RNG.
inline std::vector<double> random_weights(std::size_t n) {
  std::vector<double> w(n);
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto uniform = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (static_cast<double>(state >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
  };
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  }
  return w;
}

}  // namespace gradcheck_detail

inline void expect_gradients_match(std::function<Tensor(const std::vector<Tensor>&)> f,
                                   std::vector<Tensor> inputs_f64, double atol = 1e-6, double rtol = 1e-5) {
  constexpr double eps = 1e-6;
  constexpr int kMaxReported = 8;

  // Leaves: contiguous f64 copies of the inputs being checked; everything else passes through.
  std::vector<Tensor> x(inputs_f64.size());
  std::vector<bool> checked(inputs_f64.size(), false);
  bool any = false;
  for (std::size_t k = 0; k < inputs_f64.size(); ++k) {
    const Tensor& in = inputs_f64[k];
    if (in.defined() && in.requires_grad()) {
      ASSERT_EQ(in.dtype(), DType::f64) << "gradcheck: input " << k << " requires grad but is "
                                        << dtype_name(in.dtype()) << "; checked inputs must be f64";
      x[k] = in.detach().clone();
      x[k].set_requires_grad(true);
      checked[k] = true;
      any = true;
    } else {
      x[k] = in.defined() ? in.detach() : in;
    }
  }
  ASSERT_TRUE(any) << "gradcheck: no input requires grad, so nothing would be checked";

  // Analytic gradients from one backward pass of L = sum(y * w).
  const Tensor y = f(x);
  ASSERT_TRUE(y.defined()) << "gradcheck: f returned an undefined tensor";
  ASSERT_EQ(y.dtype(), DType::f64) << "gradcheck: f must return f64, got " << dtype_name(y.dtype());
  ASSERT_TRUE(y.requires_grad()) << "gradcheck: the output does not require grad (no graph was recorded)";
  const std::vector<double> w = gradcheck_detail::random_weights(static_cast<std::size_t>(y.numel()));
  const Tensor w_tensor = tensor(w, y.shape());
  y.backward(w_tensor);  // dL/dy = w

  autograd::NoGradGuard no_grad;
  for (std::size_t k = 0; k < x.size(); ++k) {
    if (!checked[k]) continue;
    Tensor analytic = x[k].grad();
    if (analytic.defined()) {
      ASSERT_EQ(analytic.shape(), x[k].shape()) << "gradcheck: gradient of input " << k << " has the wrong shape";
      analytic = analytic.to(DType::f64).contiguous();
    } else {
      analytic = zeros(x[k].shape(), DType::f64);
    }
    std::vector<Tensor> probe = x;
    probe[k] = x[k].detach();  // same storage, no history: perturbed in place below
    double* p = probe[k].data<double>();
    const double* a = analytic.data<double>();
    int failures = 0;
    std::ostringstream report;
    for (std::int64_t j = 0; j < probe[k].numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + eps;
      const double plus = gradcheck_detail::weighted_sum(f(probe), w);
      p[j] = saved - eps;
      const double minus = gradcheck_detail::weighted_sum(f(probe), w);
      p[j] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      const double diff = std::abs(a[j] - numeric);
      if (!(diff <= atol + rtol * std::abs(numeric))) {  // written so NaN fails
        if (failures < kMaxReported) {
          report << "\n  input " << k << " " << shape_str(x[k].shape()) << " element " << j << ": analytic " << a[j]
                 << ", numeric " << numeric << ", |diff| " << diff;
        }
        ++failures;
      }
    }
    EXPECT_EQ(failures, 0) << "gradcheck: " << failures << " of " << probe[k].numel()
                           << " gradient elements differ from central differences (atol " << atol << ", rtol "
                           << rtol << "):" << report.str();
  }
}

}  // namespace memtrain::testing
