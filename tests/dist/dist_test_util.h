// Helpers of the communicator tests: contributions every rank can generate for every rank (from a seed), and
// the canonical tree evaluated serially, element by element, independently of src/dist/canonical_sum.cpp.
#pragma once

#include "memtrain/core/float_types.h"
#include "memtrain/core/tensor.h"
#include "memtrain/dist/communicator.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace memtrain::dist_test {

// n values of rank `leaf`'s contribution: random signs and magnitudes spread over 2^-10 .. 2^10, so any other
// order of summation gives other bits. `positive` keeps them in [0.5, 2) (for relative-error checks).
inline std::vector<double> leaf_values(std::uint64_t seed, int leaf, std::int64_t n, bool positive = false) {
  std::mt19937_64 gen(seed * 1000003 + static_cast<std::uint64_t>(leaf));
  std::uniform_real_distribution<double> unit(0.5, 2.0);
  std::uniform_int_distribution<int> exponent(-10, 10);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) {
    x = unit(gen);
    if (!positive) x = std::ldexp(gen() % 2 ? x : -x, exponent(gen));
  }
  return v;
}

// The leaf as a tensor of `dtype` (rounded once from the double values).
inline Tensor leaf_tensor(std::uint64_t seed, int leaf, std::int64_t n, DType dtype, bool positive = false) {
  const std::vector<double> v = leaf_values(seed, leaf, n, positive);
  return from_buffer(v.data(), {n}, DType::f64, dtype);
}

// leaf(l) for l in [lo, lo + n), combined by the canonical tree: split at the largest power of two below n.
template <typename Acc>
Acc serial_tree(const std::function<Acc(int)>& leaf, int lo, int n) {
  if (n == 1) return leaf(lo);
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n - 1)));
  return serial_tree<Acc>(leaf, lo, p) + serial_tree<Acc>(leaf, lo + p, n - p);
}

// Element i of every leaf tensor (f32, f64, bf16 or f16), widened exactly to the accumulation type Acc.
template <typename Acc>
Acc element(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f64: return static_cast<Acc>(t.data<double>()[i]);
    case DType::f32: return static_cast<Acc>(t.data<float>()[i]);
    case DType::bf16: return static_cast<Acc>(t.data<BFloat16>()[i].to_float());
    case DType::f16: return static_cast<Acc>(t.data<Half>()[i].to_float());
    default: return Acc(0);
  }
}

// The serial canonical sum of `leaves` over elements [begin, end), rounded once to the leaves' dtype.
inline Tensor serial_canonical_sum(const std::vector<Tensor>& leaves, std::int64_t begin, std::int64_t end) {
  const DType dtype = leaves.front().dtype();
  const int n = static_cast<int>(leaves.size());
  std::vector<double> sums(static_cast<std::size_t>(end - begin));
  std::vector<float> sums_f32(sums.size());
  for (std::int64_t i = begin; i < end; ++i) {
    const auto at = static_cast<std::size_t>(i - begin);
    if (dtype == DType::f64) {
      sums[at] = serial_tree<double>([&](int l) { return element<double>(leaves[l], i); }, 0, n);
    } else {
      sums_f32[at] = serial_tree<float>([&](int l) { return element<float>(leaves[l], i); }, 0, n);
    }
  }
  // f32 -> bf16 / f16 with the format's own rounding (core/float_types.h), f64 stays as it is.
  return dtype == DType::f64 ? from_buffer(sums.data(), {end - begin}, DType::f64, DType::f64)
                             : from_buffer(sums_f32.data(), {end - begin}, DType::f32, dtype);
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

// The part [begin, end) of a flat tensor, as a contiguous copy.
inline Tensor part(const Tensor& t, std::int64_t begin, std::int64_t end) {
  return t.narrow(0, begin, end - begin).contiguous();
}

}  // namespace memtrain::dist_test
