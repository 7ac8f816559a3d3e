// cpu/gemm.h against a naive float64 triple loop written here: every transpose combination, on every
// backend built in, odd sizes, padded leading dimensions (with sentinels in the padding), alpha/beta not
// 1/0, the degenerate sizes, batches, and bad arguments.
#include "cpu/gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/gemm_impl.h"
#include "memtrain/core/error.h"

namespace memtrain::cpu {
namespace {

enum class Elem { f32, f64, bf16 };

const char* elem_name(Elem e) { return e == Elem::f32 ? "f32" : e == Elem::f64 ? "f64" : "bf16"; }

// bf16 <-> double, written independently of the library: bf16 is the top half of an f32.
uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even (inputs here are finite)
  return static_cast<uint16_t>(bits >> 16);
}
double from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Case {
  bool ta = false, tb = false;
  int64_t m = 1, n = 1, k = 1;
  double alpha = 1.0, beta = 0.0;
  int64_t pad = 0;     // extra elements per row of every operand (non-tight ld)
  int64_t batch = 1;   // > 1: batched entry point
  bool share_b = false;  // batched with stride_b == 0
};

// Tolerance, as a multiple of scale = |alpha| sum_l |a_il b_lj| + |beta c_ij|:
//  f32 and bf16: fp32 accumulation over k terms; blocked/FMA sums make the error grow like sqrt(k) unit
//    roundoffs in practice (k of them in the worst case), so 1e-5 * sqrt(k) (~80 u sqrt(k)) is safe yet far
//    below the O(1) error of a wrong element, transpose or stride. bf16 inputs are rounded to bf16 before
//    the reference sees them, so only that same fp32 accumulation error remains.
//  f64: the same argument with double's unit roundoff.
double tolerance(Elem e, int64_t k) {
  const double sk = std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  return (e == Elem::f64 ? 1e-13 : 1e-5) * sk;
}

class Gemm {
 public:
  Gemm(Elem elem, const Case& c, uint32_t seed) : e_(elem), c_(c) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    a_rows_ = c.ta ? c.k : c.m, a_cols_ = c.ta ? c.m : c.k;
    b_rows_ = c.tb ? c.n : c.k, b_cols_ = c.tb ? c.k : c.n;
    lda_ = a_cols_ + c.pad, ldb_ = b_cols_ + c.pad, ldc_ = c.n + c.pad;
    // Batch strides with a gap of 5 elements between matrices, so an overrun lands on a sentinel.
    sa_ = a_rows_ * lda_ + 5, sb_ = c.share_b ? 0 : b_rows_ * ldb_ + 5, sc_ = c.m * ldc_ + 5;
    const int64_t na = std::max<int64_t>(1, c.batch * sa_), nb = std::max<int64_t>(1, c.batch * sb_ + b_rows_ * ldb_);
    const int64_t nc = std::max<int64_t>(1, c.batch * sc_);
    // Inputs are stored in the element type; `ad_`/`bd_` hold exactly the stored values as double.
    ad_.resize(na), bd_.resize(nb), cd_.resize(nc);
    for (auto& x : ad_) x = quantize(u(rng));
    for (auto& x : bd_) x = quantize(u(rng));
    for (auto& x : cd_) x = e_ == Elem::f64 ? u(rng) : static_cast<float>(u(rng));
    if (e_ == Elem::f64) {
      a64_ = ad_, b64_ = bd_, c64_ = cd_;
    } else {
      c32_.assign(cd_.begin(), cd_.end());
      if (e_ == Elem::f32) {
        a32_.assign(ad_.begin(), ad_.end()), b32_.assign(bd_.begin(), bd_.end());
      } else {
        for (double x : ad_) a16_.push_back(to_bf16(static_cast<float>(x)));
        for (double x : bd_) b16_.push_back(to_bf16(static_cast<float>(x)));
      }
    }
  }

  void set_c(double v) {
    std::fill(cd_.begin(), cd_.end(), v);
    std::fill(c32_.begin(), c32_.end(), static_cast<float>(v));
    std::fill(c64_.begin(), c64_.end(), v);
  }

  void run() {
    const Case& c = c_;
    const bool batched = c.batch != 1;
    switch (e_) {
      case Elem::f32:
        if (batched) {
          gemm_batched_f32(c.ta, c.tb, c.m, c.n, c.k, float(c.alpha), a32_.data(), lda_, b32_.data(), ldb_,
                           float(c.beta), c32_.data(), ldc_, c.batch, sa_, sb_, sc_);
        } else {
          gemm_f32(c.ta, c.tb, c.m, c.n, c.k, float(c.alpha), a32_.data(), lda_, b32_.data(), ldb_,
                   float(c.beta), c32_.data(), ldc_);
        }
        break;
      case Elem::f64:
        if (batched) {
          gemm_batched_f64(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a64_.data(), lda_, b64_.data(), ldb_, c.beta,
                           c64_.data(), ldc_, c.batch, sa_, sb_, sc_);
        } else {
          gemm_f64(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a64_.data(), lda_, b64_.data(), ldb_, c.beta,
                   c64_.data(), ldc_);
        }
        break;
      case Elem::bf16:
        if (batched) {
          gemm_batched_bf16(c.ta, c.tb, c.m, c.n, c.k, float(c.alpha), a16_.data(), lda_, b16_.data(), ldb_,
                            float(c.beta), c32_.data(), ldc_, c.batch, sa_, sb_, sc_);
        } else {
          gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, float(c.alpha), a16_.data(), lda_, b16_.data(), ldb_,
                    float(c.beta), c32_.data(), ldc_);
        }
        break;
    }
  }

  // Runs the oneDNN matmul primitive directly with f32 inputs: the same descriptor code the bf16 path
  // uses on CPUs with native bf16, checked here on any CPU. Returns false when oneDNN declined.
  bool run_matmul_primitive_f32() {
    detail::GemmDims d;
    d.trans_a = c_.ta, d.trans_b = c_.tb, d.m = c_.m, d.n = c_.n, d.k = c_.k;
    d.lda = lda_, d.ldb = ldb_, d.ldc = ldc_, d.batch = c_.batch, d.stride_a = sa_, d.stride_b = sb_,
    d.stride_c = sc_;
    return detail::onednn_matmul(false, d, float(c_.alpha), a32_.data(), b32_.data(), float(c_.beta),
                                 c32_.data());
  }

  // Compares every element of every C (and every padding/gap element, which must be untouched) with the
  // float64 triple loop. Returns the number of mismatches (reported through gtest).
  int check() const {
    const Case& c = c_;
    const double tol = tolerance(e_, c.k);
    int bad = 0;
    std::vector<bool> inside(cd_.size(), false);
    for (int64_t bi = 0; bi < c.batch; ++bi) {
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          double dot = 0.0, mag = 0.0;
          for (int64_t l = 0; l < c.k; ++l) {
            const double av = ad_[bi * sa_ + (c.ta ? l * lda_ + i : i * lda_ + l)];
            const double bv = bd_[bi * sb_ + (c.tb ? j * ldb_ + l : l * ldb_ + j)];
            dot += av * bv;
            mag += std::abs(av * bv);
          }
          const int64_t at = bi * sc_ + i * ldc_ + j;
          inside[at] = true;
          const double c0 = cd_[at];
          const double want = c.alpha * dot + (c.beta == 0.0 ? 0.0 : c.beta * c0);
          const double scale = std::abs(c.alpha) * mag + (c.beta == 0.0 ? 0.0 : std::abs(c.beta * c0));
          const double got = out(at);
          if (!(std::abs(got - want) <= tol * scale + 1e-300) && bad++ < 5) {
            ADD_FAILURE() << elem_name(e_) << " C[" << bi << "][" << i << "][" << j << "] = " << got
                          << ", want " << want << " (tol " << tol * scale << ")";
          }
        }
      }
    }
    for (size_t at = 0; at < cd_.size(); ++at) {
      if (!inside[at] && !(out(static_cast<int64_t>(at)) == cd_[at] ||
                           (std::isnan(out(static_cast<int64_t>(at))) && std::isnan(cd_[at])))) {
        if (bad++ < 5) ADD_FAILURE() << elem_name(e_) << " padding element " << at << " was written";
      }
    }
    return bad;
  }

 private:
  double quantize(double x) const {
    if (e_ == Elem::f64) return x;
    if (e_ == Elem::f32) return static_cast<float>(x);
    return from_bf16(to_bf16(static_cast<float>(x)));
  }
  double out(int64_t at) const { return e_ == Elem::f64 ? c64_[at] : c32_[at]; }

  Elem e_;
  Case c_;
  int64_t a_rows_, a_cols_, b_rows_, b_cols_, lda_, ldb_, ldc_, sa_, sb_, sc_;
  std::vector<double> ad_, bd_, cd_;
  std::vector<float> a32_, b32_, c32_;
  std::vector<double> a64_, b64_, c64_;
  std::vector<uint16_t> a16_, b16_;
};

// Switches the process-wide backend for one test and restores it after.
class BackendScope {
 public:
  explicit BackendScope(GemmBackend b) : saved_(gemm_backend()) { set_gemm_backend(b); }
  ~BackendScope() { set_gemm_backend(saved_); }

 private:
  GemmBackend saved_;
};

std::vector<GemmBackend> built_backends() {
  std::vector<GemmBackend> out{GemmBackend::eigen};
  if (gemm_onednn_available()) out.push_back(GemmBackend::onednn);
  return out;
}

using Param = std::tuple<GemmBackend, Elem, bool, bool>;

class GemmAll : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == GemmBackend::onednn && !gemm_onednn_available()) {
      GTEST_SKIP() << "built without oneDNN";
    }
  }
  Case base() const {
    Case c;
    c.ta = std::get<2>(GetParam()), c.tb = std::get<3>(GetParam());
    return c;
  }
  Elem elem() const { return std::get<1>(GetParam()); }
};

TEST_P(GemmAll, OddSizesMatchFloat64Reference) {
  BackendScope scope(std::get<0>(GetParam()));
  const int64_t sizes[][3] = {{1, 1, 1},   {7, 1, 3},    {1, 7, 33},  {7, 33, 65},
                              {33, 65, 7}, {65, 130, 33}, {130, 7, 65}, {129, 131, 257}};
  uint32_t seed = 1;
  for (const auto& s : sizes) {
    for (int64_t pad : {0, 3}) {
      Case c = base();
      c.m = s[0], c.n = s[1], c.k = s[2], c.pad = pad;
      c.alpha = pad ? -0.75 : 1.0;
      c.beta = pad ? 0.5 : 0.0;
      SCOPED_TRACE(testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " pad=" << pad);
      Gemm g(elem(), c, seed++);
      g.run();
      EXPECT_EQ(g.check(), 0);
    }
  }
}

TEST_P(GemmAll, BetaZeroOverwritesNaN) {
  BackendScope scope(std::get<0>(GetParam()));
  Case c = base();
  c.m = 33, c.n = 17, c.k = 9, c.pad = 2, c.alpha = 2.0, c.beta = 0.0;
  Gemm g(elem(), c, 7);
  g.set_c(std::numeric_limits<double>::quiet_NaN());  // padding stays NaN, which check() allows
  g.run();
  EXPECT_EQ(g.check(), 0);
}

TEST_P(GemmAll, KZeroAndAlphaZeroScaleC) {
  BackendScope scope(std::get<0>(GetParam()));
  for (double alpha : {1.5, 0.0}) {
    for (double beta : {0.0, 1.0, -2.0}) {
      Case c = base();
      c.m = 7, c.n = 5, c.k = alpha == 0.0 ? 3 : 0, c.pad = 1, c.alpha = alpha, c.beta = beta;
      SCOPED_TRACE(testing::Message() << "alpha=" << alpha << " beta=" << beta);
      Gemm g(elem(), c, 11);
      g.run();
      EXPECT_EQ(g.check(), 0);
    }
  }
}

TEST_P(GemmAll, Batched) {
  BackendScope scope(std::get<0>(GetParam()));
  // Small products: split across threads whenever batch >= threads (batch 2 at 1 thread runs in turn).
  // The 130-sized products (> 4 MFLOP) with batch 3 at 2 threads run one after another, each threaded.
  struct Sizes { int64_t m, n, k, batch; };
  const Sizes sizes[] = {{13, 33, 65, 2}, {13, 33, 65, 5}, {13, 33, 65, 16}, {130, 131, 129, 3}};
  for (const Sizes& s : sizes) {
    for (bool share_b : {false, true}) {
      Case c = base();
      c.m = s.m, c.n = s.n, c.k = s.k, c.pad = 2, c.alpha = 0.5, c.beta = -1.0, c.batch = s.batch;
      c.share_b = share_b;
      SCOPED_TRACE(testing::Message() << "m=" << s.m << " batch=" << s.batch << " share_b=" << share_b);
      Gemm g(elem(), c, 100 + static_cast<uint32_t>(s.batch));
      g.run();
      EXPECT_EQ(g.check(), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, GemmAll,
    ::testing::Combine(::testing::Values(GemmBackend::onednn, GemmBackend::eigen),
                       ::testing::Values(Elem::f32, Elem::f64, Elem::bf16), ::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::string(gemm_backend_name(std::get<0>(info.param))) + "_" + elem_name(std::get<1>(info.param)) +
             (std::get<2>(info.param) ? "_T" : "_N") + (std::get<3>(info.param) ? "T" : "N");
    });

// bf16 with m + n large enough that the widening path (CPUs without native bf16) splits k into blocks,
// accumulating into C with beta = 1 after the first block. On CPUs with native bf16 oneDNN runs it whole.
TEST(GemmBf16, DeepKAcrossWideningBlocks) {
  for (GemmBackend backend : built_backends()) {
    BackendScope scope(backend);
    for (bool tb : {false, true}) {
      Case c;
      c.ta = tb, c.tb = tb, c.m = 3, c.n = 17000, c.k = 600, c.pad = 1, c.alpha = 1.25, c.beta = 0.5;
      SCOPED_TRACE(testing::Message() << gemm_backend_name(backend) << " trans=" << tb);
      Gemm g(Elem::bf16, c, 5);
      g.run();
      EXPECT_EQ(g.check(), 0);
    }
  }
}

// The results must not depend on the thread count (oneDNN fixes it when a primitive is created, so the
// primitive cache has to key on it).
TEST(Gemm, OneAndTwoThreadsBothCorrect) {
  const int saved = omp_get_max_threads();
  for (GemmBackend backend : built_backends()) {
    BackendScope scope(backend);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      for (Elem e : {Elem::f32, Elem::bf16}) {
        Case c;
        c.tb = true, c.m = 96, c.n = 80, c.k = 200, c.alpha = 1.0, c.beta = 1.0;
        SCOPED_TRACE(testing::Message() << gemm_backend_name(backend) << " threads=" << threads << " "
                                        << elem_name(e));
        Gemm g(e, c, 3);
        g.run();
        EXPECT_EQ(g.check(), 0);
      }
    }
  }
  omp_set_num_threads(saved);
}

// The matmul primitive's memory descriptors (strides for transposes, 3-D batch, stride-0 broadcast,
// output scale for alpha, sum post-op for beta) checked with f32 inputs, which oneDNN supports on every
// CPU; bf16 on AVX-512 CPUs reuses exactly this descriptor code with another data type.
TEST(GemmOnednnMatmul, DescriptorsMatchReference) {
  if (!gemm_onednn_available()) GTEST_SKIP() << "built without oneDNN";
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int64_t batch : {1, 4}) {
        Case c;
        c.ta = ta, c.tb = tb, c.m = 33, c.n = 65, c.k = 130, c.pad = 3, c.alpha = -0.5, c.beta = 2.0;
        c.batch = batch, c.share_b = batch > 1 && ta;
        SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb << " batch=" << batch);
        Gemm g(Elem::f32, c, 42);
        ASSERT_TRUE(g.run_matmul_primitive_f32()) << "oneDNN has an f32 matmul on every x86-64 CPU";
        EXPECT_EQ(g.check(), 0);
      }
    }
  }
}

TEST(GemmOnednnMatmul, PrimitiveIsCachedPerShape) {
  if (!gemm_onednn_available()) GTEST_SKIP() << "built without oneDNN";
  Case c;
  c.m = 5, c.n = 6, c.k = 7, c.alpha = 1.0, c.beta = 0.0;
  Gemm g1(Elem::f32, c, 1);
  ASSERT_TRUE(g1.run_matmul_primitive_f32());
  const int64_t after_first = detail::onednn_matmul_cache_size();
  Gemm g2(Elem::f32, c, 2);  // same shape, other data: no new primitive
  ASSERT_TRUE(g2.run_matmul_primitive_f32());
  EXPECT_EQ(detail::onednn_matmul_cache_size(), after_first);
  EXPECT_EQ(g2.check(), 0);
  c.beta = 1.0;  // beta is baked into the primitive: a new entry
  Gemm g3(Elem::f32, c, 3);
  ASSERT_TRUE(g3.run_matmul_primitive_f32());
  EXPECT_EQ(detail::onednn_matmul_cache_size(), after_first + 1);
  EXPECT_EQ(g3.check(), 0);
}

TEST(Gemm, DegenerateMOrNLeavesCUntouched) {
  std::vector<float> a(8, 1.0f), b(8, 1.0f), c(8, 3.0f);
  gemm_f32(false, false, 0, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
  gemm_f32(false, false, 2, 0, 2, 1.0f, a.data(), 2, b.data(), 1, 0.0f, c.data(), 1);
  gemm_batched_f32(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2, 0, 4, 4, 4);
  for (float v : c) EXPECT_EQ(v, 3.0f);
}

// A contiguous [m,0] tensor has row stride 0: k == 0 with lda == 0 is valid and only scales C.
TEST(Gemm, EmptyRowsAllowZeroLeadingDimension) {
  std::vector<float> c(6, 2.0f);
  gemm_f32(false, false, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 3, 0.5f, c.data(), 3);
  for (float v : c) EXPECT_EQ(v, 1.0f);
  gemm_f32(false, true, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 0, 0.0f, c.data(), 3);
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

TEST(Gemm, BadArgumentsThrow) {
  std::vector<float> f(64, 0.0f);
  std::vector<double> d(64, 0.0);
  std::vector<uint16_t> h(64, 0);
  auto throws_gemm = [](auto&& fn, const char* what) {
    try {
      fn();
      ADD_FAILURE() << "no throw: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gemm"), std::string::npos) << e.what();
    }
  };
  throws_gemm([&] { gemm_f32(false, false, -1, 2, 2, 1.f, f.data(), 2, f.data(), 2, 0.f, f.data(), 2); },
              "negative m");
  throws_gemm([&] { gemm_f64(false, false, 2, 2, -3, 1.0, d.data(), 2, d.data(), 2, 0.0, d.data(), 2); },
              "negative k");
  // A is [4,3] (lda >= 3) untransposed, stored [3,4] (lda >= 4) transposed.
  throws_gemm([&] { gemm_f32(false, false, 4, 2, 3, 1.f, f.data(), 2, f.data(), 2, 0.f, f.data(), 2); },
              "lda < k");
  throws_gemm([&] { gemm_f32(true, false, 4, 2, 3, 1.f, f.data(), 3, f.data(), 2, 0.f, f.data(), 2); },
              "lda < m when trans_a");
  // B is [3,2] (ldb >= 2) untransposed, stored [2,3] (ldb >= 3) transposed.
  throws_gemm([&] { gemm_bf16(false, false, 4, 2, 3, 1.f, h.data(), 3, h.data(), 1, 0.f, f.data(), 2); },
              "ldb < n");
  throws_gemm([&] { gemm_bf16(false, true, 4, 2, 3, 1.f, h.data(), 3, h.data(), 2, 0.f, f.data(), 2); },
              "ldb < k when trans_b");
  throws_gemm([&] { gemm_f32(false, false, 4, 2, 3, 1.f, f.data(), 3, f.data(), 2, 0.f, f.data(), 1); },
              "ldc < n");
  throws_gemm([&] { gemm_f32(false, false, 4, 2, 3, 1.f, nullptr, 3, f.data(), 2, 0.f, f.data(), 2); },
              "null A");
  throws_gemm(
      [&] {
        gemm_batched_f32(false, false, 4, 2, 3, 1.f, f.data(), 3, f.data(), 2, 0.f, f.data(), 2, 2, 12, 6, 7);
      },
      "overlapping C matrices");
  throws_gemm(
      [&] {
        gemm_batched_f64(false, false, 2, 2, 2, 1.0, d.data(), 2, d.data(), 2, 0.0, d.data(), 2, 2, -4, 4, 4);
      },
      "negative stride");
  throws_gemm(
      [&] {
        gemm_batched_bf16(false, false, 2, 2, 2, 1.f, h.data(), 2, h.data(), 2, 0.f, f.data(), 2, -1, 4, 4, 4);
      },
      "negative batch");
}

TEST(Gemm, BackendSelection) {
  EXPECT_STREQ(gemm_backend_name(GemmBackend::onednn), "onednn");
  EXPECT_STREQ(gemm_backend_name(GemmBackend::eigen), "eigen");
  const GemmBackend saved = gemm_backend();
  EXPECT_EQ(saved, gemm_onednn_available() ? GemmBackend::onednn : GemmBackend::eigen);
  set_gemm_backend(GemmBackend::eigen);
  EXPECT_EQ(gemm_backend(), GemmBackend::eigen);
  if (gemm_onednn_available()) {
    set_gemm_backend(GemmBackend::onednn);
    EXPECT_EQ(gemm_backend(), GemmBackend::onednn);
  } else {
    EXPECT_THROW(set_gemm_backend(GemmBackend::onednn), Error);
    EXPECT_EQ(gemm_backend(), GemmBackend::eigen);
  }
  set_gemm_backend(saved);
}

}  // namespace
}  // namespace memtrain::cpu
