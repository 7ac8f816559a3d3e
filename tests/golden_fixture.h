// Reader and comparison helpers for the PyTorch golden fixtures in tests/fixtures/ (format documented in
// scripts/make_golden_fixtures.py), shared by test_golden.cpp (ops composition) and test_nn.cpp (nn::GPT).
//
// Error measure: normwise relative error ||got - ref||_2 / ||ref||_2 per tensor. The max elementwise
// relative error is printed alongside, with the denominator floored at 1e-3 * max|ref| so that entries that
// are nearly zero by cancellation do not swamp it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "memtrain/core/tensor.h"

namespace memtrain::golden {

// ---- fixture reader (format documented in scripts/make_golden_fixtures.py) ------------------------------

struct Record {
  std::uint8_t dtype = 0;  // 0 f64, 1 f32, 2 i64
  Shape shape;
  std::vector<double> values;       // f64 and f32 records (f32 widened exactly)
  std::vector<std::int64_t> ints;   // i64 records
};
using Fixture = std::map<std::string, Record>;

static_assert(std::endian::native == std::endian::little, "fixtures are little-endian");

class ByteReader {
 public:
  explicit ByteReader(std::vector<char> bytes) : bytes_(std::move(bytes)) {}
  template <typename T>
  T get() {
    T v;
    take(&v, sizeof(T));
    return v;
  }
  void take(void* dst, std::size_t n) {
    if (n > bytes_.size() - pos_) throw std::runtime_error("golden fixture: truncated file");
    std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
  }
  bool at_end() const { return pos_ == bytes_.size(); }

 private:
  std::vector<char> bytes_;
  std::size_t pos_ = 0;
};

inline Fixture load_fixture(const std::string& file) {
  const std::string path = std::string(MEMTRAIN_FIXTURES_DIR) + "/" + file;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("golden fixture: cannot open " + path);
  ByteReader r(std::vector<char>(std::istreambuf_iterator<char>(in), {}));
  char magic[8];
  r.take(magic, 8);
  if (std::memcmp(magic, "MTGOLD01", 8) != 0) throw std::runtime_error("golden fixture: bad magic in " + path);
  Fixture fx;
  const auto count = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string name(r.get<std::uint32_t>(), '\0');
    r.take(name.data(), name.size());
    Record rec;
    rec.dtype = r.get<std::uint8_t>();
    const auto ndim = r.get<std::uint8_t>();
    for (int d = 0; d < ndim; ++d) rec.shape.push_back(r.get<std::int64_t>());
    const auto n = static_cast<std::size_t>(shape_numel(rec.shape));
    if (rec.dtype == 0) {
      rec.values.resize(n);
      r.take(rec.values.data(), n * sizeof(double));
    } else if (rec.dtype == 1) {
      std::vector<float> f(n);
      r.take(f.data(), n * sizeof(float));
      rec.values.assign(f.begin(), f.end());
    } else if (rec.dtype == 2) {
      rec.ints.resize(n);
      r.take(rec.ints.data(), n * sizeof(std::int64_t));
    } else {
      throw std::runtime_error("golden fixture: unknown dtype code in " + name);
    }
    fx.emplace(std::move(name), std::move(rec));
  }
  if (!r.at_end()) throw std::runtime_error("golden fixture: trailing bytes in " + path);
  return fx;
}

inline const Record& at(const Fixture& fx, const std::string& name) {
  auto it = fx.find(name);
  if (it == fx.end()) throw std::runtime_error("golden fixture: no record " + name);
  return it->second;
}

inline bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Every "input/*" and "param/*" record as a tensor: integers stay i64, floats become `dtype`. A leaf whose
// gradient is stored ("grad/<name>") requires grad.
inline std::map<std::string, Tensor> make_leaves(const Fixture& fx, DType dtype) {
  std::map<std::string, Tensor> leaves;
  for (const auto& [name, rec] : fx) {
    if (!starts_with(name, "input/") && !starts_with(name, "param/")) continue;
    Tensor t = rec.dtype == 2 ? from_buffer(rec.ints.data(), rec.shape, DType::i64, DType::i64)
                              : from_buffer(rec.values.data(), rec.shape, DType::f64, dtype);
    if (fx.count("grad/" + name) != 0) t.set_requires_grad(true);
    leaves.emplace(name, t);
  }
  return leaves;
}

// ---- comparison ---------------------------------------------------------------------------------------------

struct ErrorStats {
  double normwise = 0.0;
  double max_elementwise = 0.0;
};

inline ErrorStats relative_error(const Tensor& got, const Record& ref) {
  Tensor g = got.detach().to(DType::f64).contiguous();
  const double* gv = g.data<double>();
  double diff2 = 0.0, ref2 = 0.0, ref_max = 0.0;
  for (double r : ref.values) ref_max = std::max(ref_max, std::abs(r));
  ErrorStats e;
  for (std::size_t i = 0; i < ref.values.size(); ++i) {
    const double d = gv[i] - ref.values[i];
    diff2 += d * d;
    ref2 += ref.values[i] * ref.values[i];
    const double denom = std::max(std::abs(ref.values[i]), 1e-3 * ref_max);
    e.max_elementwise = std::max(e.max_elementwise, std::abs(d) / denom);
  }
  e.normwise = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (std::isnan(diff2)) e.normwise = e.max_elementwise = NAN;
  return e;
}

// Compares one tensor with its reference; prints both error measures so the margin is visible in the log.
inline void expect_close(const std::string& name, const Tensor& got, const Record& ref, double tol) {
  ASSERT_TRUE(got.defined()) << name << ": memtrain produced no tensor (gradient not reached?)";
  ASSERT_EQ(got.shape(), ref.shape) << name << ": shape " << shape_str(got.shape()) << " vs reference "
                                    << shape_str(ref.shape);
  const ErrorStats e = relative_error(got, ref);
  std::printf("    %-30s normwise %.2e   max elementwise %.2e\n", name.c_str(), e.normwise, e.max_elementwise);
  EXPECT_LE(e.normwise, tol) << name << ": normwise relative error " << e.normwise << " (max elementwise "
                             << e.max_elementwise << ")";
}

}  // namespace memtrain::golden
