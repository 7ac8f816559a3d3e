// Small helpers shared by the op tests: reading tensors back as doubles, seeded random inputs, and an
// independent broadcasting index so reference values never go through the code under test.
#pragma once

#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace memtrain::testing {

// Every element of t (any dtype, any layout), row-major, exactly widened to double.
inline std::vector<double> values_of(const Tensor& t) {
  const Tensor c = t.detach().to(DType::f64).contiguous();
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

// Uniform in [lo, hi) as f64 (then converted to dtype); seeded per call site for reproducibility.
inline Tensor uniform(const Shape& shape, double lo, double hi, std::uint64_t seed, DType dtype = DType::f64) {
  manual_seed(seed);
  const Tensor u = rand(shape, DType::f64);
  std::vector<double> v = values_of(u);
  for (double& x : v) x = lo + (hi - lo) * (1.0 - x);  // rand is (0, 1]
  return tensor(v, shape).to(dtype);
}

inline Tensor normal(const Shape& shape, std::uint64_t seed, DType dtype = DType::f64) {
  manual_seed(seed);
  return randn(shape, dtype);
}

// Row-major multi-index of flat position i in `shape`.
inline Shape unravel(std::int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = i % shape[k];
    i /= shape[k];
  }
  return idx;
}

// Flat row-major position in `shape` of the element that out-index `out_idx` (of a broadcast result)
// reads: leading dims dropped, size-1 dims pinned to 0.
inline std::int64_t broadcast_source(const Shape& out_idx, const Shape& shape) {
  const std::size_t lead = out_idx.size() - shape.size();
  std::int64_t flat = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + (shape[k] == 1 ? 0 : out_idx[lead + k]);
  return flat;
}

// |actual - expected| <= atol + rtol |expected| elementwise, NaN only where expected is NaN.
inline void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, double rtol,
                         double atol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const bool both_nan = std::isnan(actual[i]) && std::isnan(expected[i]);
    const bool ok = both_nan || (actual[i] == expected[i]) ||
                    std::abs(actual[i] - expected[i]) <= atol + rtol * std::abs(expected[i]);
    if (!ok && failures++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << actual[i] << ", expected " << expected[i];
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// Expects `f` to throw memtrain::Error whose message contains every string in `needles`.
template <typename F>
void expect_error(F f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected memtrain::Error mentioning " << (needles.empty() ? "" : needles[0]);
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << msg << "' lacks '" << n << "'";
  }
}

}  // namespace memtrain::testing
