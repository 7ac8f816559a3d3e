// Tests of ops::fused_linear_cross_entropy: loss and gradients equal to the unfused
// cross_entropy(linear(x, W, b)) path, for chunkings that do and do not divide N, every reduction, with
// and without bias, i32/i64 targets and ignored rows; peak memory well below the unfused path's; errors.
// Tolerance: rel 1e-5 normwise (f32; the chunked GEMMs may round differently from the one big GEMM).
#include "op_test_util.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace memtrain {
namespace {

using ops::Reduction;
using testing::expect_error;
using testing::normal;
using testing::values_of;

constexpr double kRtol = 1e-5;

// Targets in [0, V) with about a fifth of them set to `ignore` (seeded).
Tensor make_targets(std::int64_t N, std::int64_t V, std::int64_t ignore, DType dtype, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> cls(0, V - 1);
  std::uniform_int_distribution<int> coin(0, 4);
  std::vector<std::int64_t> v(static_cast<std::size_t>(N));
  for (auto& t : v) t = coin(gen) == 0 ? ignore : cls(gen);
  return tensor(v, {N}).to(dtype);
}

// ||a - b|| <= rtol ||b|| (both NaN everywhere counts as equal).
void expect_normwise(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_TRUE(expected.defined()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = values_of(actual), e = values_of(expected);
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(e[i])) continue;
    diff += (a[i] - e[i]) * (a[i] - e[i]);
    ref += e[i] * e[i];
  }
  EXPECT_FALSE(std::isnan(diff)) << what << ": NaN where the reference has none";
  EXPECT_LE(std::sqrt(diff), kRtol * std::sqrt(ref) + 1e-30) << what;
}

struct Result {
  Tensor loss, dx, dw, db;
};

// Loss and gradients of fresh leaves copied from x, w, b; backward with the upstream gradient `up`.
Result run(bool fused, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& t, Reduction r,
           std::int64_t ignore, std::int64_t chunk, const Tensor& up) {
  Tensor xl = x.detach().clone().set_requires_grad(true);
  Tensor wl = w.detach().clone().set_requires_grad(true);
  Tensor bl = b.defined() ? b.detach().clone().set_requires_grad(true) : Tensor();
  const Tensor loss = fused ? ops::fused_linear_cross_entropy(xl, wl, bl, t, r, ignore, chunk)
                            : ops::cross_entropy(ops::linear(xl, wl, bl), t, r, ignore);
  loss.backward(up);
  return {loss.detach(), xl.grad(), wl.grad(), bl.defined() ? bl.grad() : Tensor()};
}

void check_case(std::int64_t N, std::int64_t C, std::int64_t V, std::int64_t chunk, bool with_bias, DType tdtype,
                Reduction r, std::int64_t ignore, std::uint32_t seed) {
  const std::string what = "N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V) +
                           " chunk=" + std::to_string(chunk) + " bias=" + std::to_string(with_bias) +
                           " r=" + std::to_string(static_cast<int>(r)) + " " + std::string(dtype_name(tdtype));
  SCOPED_TRACE(what);
  const Tensor x = normal({N, C}, seed, DType::f32);
  const Tensor w = ops::mul(normal({V, C}, seed + 1, DType::f32), 0.3);
  const Tensor b = with_bias ? normal({V}, seed + 2, DType::f32) : Tensor();
  const Tensor t = make_targets(N, V, ignore, tdtype, seed + 3);
  // A non-trivial upstream gradient: random per row for none, 0.7 for a scalar loss.
  const Tensor up = r == Reduction::none ? normal({N}, seed + 4, DType::f32) : full({}, 0.7, DType::f32);
  const Result f = run(true, x, w, b, t, r, ignore, chunk, up);
  const Result u = run(false, x, w, b, t, r, ignore, chunk, up);
  expect_normwise(f.loss, u.loss, "loss");
  expect_normwise(f.dx, u.dx, "dx");
  expect_normwise(f.dw, u.dw, "dweight");
  if (with_bias) expect_normwise(f.db, u.db, "dbias");
}

TEST(FusedLinearCrossEntropy, MatchesUnfusedAcrossChunkings) {
  std::uint32_t seed = 100;
  // (N, C, V, chunk): chunk 1, chunks that do not divide N, chunk == N, chunk > N, N = 1.
  const std::vector<std::array<std::int64_t, 4>> shapes{{1, 5, 3, 1},     {1, 5, 3, 1024}, {3, 4, 7, 1},
                                                        {3, 4, 7, 2},     {127, 16, 37, 10}, {127, 16, 37, 127},
                                                        {127, 16, 37, 500}, {1000, 33, 501, 64}, {1000, 33, 501, 1}};
  for (const auto& s : shapes) {
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
      for (bool with_bias : {true, false}) {
        const DType td = (seed % 2 == 0) ? DType::i64 : DType::i32;
        check_case(s[0], s[1], s[2], s[3], with_bias, td, r, -100, seed);
        seed += 10;
      }
    }
  }
}

TEST(FusedLinearCrossEntropy, BothTargetDtypesAndCustomIgnoreIndex) {
  for (DType td : {DType::i32, DType::i64}) {
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
      check_case(257, 24, 99, 32, true, td, r, -100, 300);
      check_case(257, 24, 99, 32, false, td, r, 5, 310);  // a valid class used as ignore_index
    }
  }
}

TEST(FusedLinearCrossEntropy, AllTargetsIgnored) {
  const Tensor x = normal({6, 4}, 400, DType::f32), w = normal({5, 4}, 401, DType::f32);
  const Tensor t = full({6}, -100, DType::i64);
  const Result f = run(true, x, w, Tensor(), t, Reduction::mean, -100, 4, Tensor());
  const Result u = run(false, x, w, Tensor(), t, Reduction::mean, -100, 4, Tensor());
  EXPECT_TRUE(std::isnan(f.loss.item()));  // 0 / 0, as cross_entropy
  EXPECT_TRUE(std::isnan(u.loss.item()));
  for (double v : values_of(f.dx)) EXPECT_EQ(v, 0.0);
  for (double v : values_of(f.dw)) EXPECT_EQ(v, 0.0);
}

TEST(FusedLinearCrossEntropy, GradientsOnlyWhereRequested) {
  const Tensor x = normal({9, 4}, 500, DType::f32).set_requires_grad(true);
  const Tensor w = normal({6, 4}, 501, DType::f32);  // no grad
  const Tensor b = normal({6}, 502, DType::f32);     // no grad
  const Tensor t = make_targets(9, 6, -100, DType::i64, 503);
  ops::fused_linear_cross_entropy(x, w, b, t, Reduction::sum, -100, 4).backward();
  const Tensor x2 = x.detach().clone().set_requires_grad(true);
  ops::cross_entropy(ops::linear(x2, w, b), t, Reduction::sum).backward();
  expect_normwise(x.grad(), x2.grad(), "dx");
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  {
    autograd::NoGradGuard no_grad;
    const Tensor x3 = normal({9, 4}, 504, DType::f32).set_requires_grad(true);
    EXPECT_EQ(ops::fused_linear_cross_entropy(x3, w, b, t).grad_fn(), nullptr);
  }
}

TEST(FusedLinearCrossEntropy, NonContiguousInputs) {
  // x seen through a transpose, weight through a column slice: results still match the unfused path.
  const Tensor xt = normal({12, 20}, 600, DType::f32).t();                  // (20, 12), strided
  const Tensor wn = normal({15, 24}, 601, DType::f32).narrow(1, 0, 12);     // (15, 12), strided rows
  const Tensor t = make_targets(20, 15, -100, DType::i32, 602);
  const Result f = run(true, xt, wn, Tensor(), t, Reduction::mean, -100, 6, Tensor());
  const Result u = run(false, xt, wn, Tensor(), t, Reduction::mean, -100, 6, Tensor());
  expect_normwise(f.loss, u.loss, "loss");
  expect_normwise(f.dx, u.dx, "dx");
  expect_normwise(f.dw, u.dw, "dweight");
}

// The peak allocator bytes of forward + backward: the fused path never holds the [N, V] logits (nor their
// gradient), only one chunk of them, so its peak is lower by at least N V - chunk V floats.
TEST(FusedLinearCrossEntropy, PeakMemoryBelowUnfusedByTheLogits) {
  const std::int64_t N = 512, V = 5000, C = 64, chunk = 64;
  const Tensor x = normal({N, C}, 700, DType::f32);
  const Tensor w = ops::mul(normal({V, C}, 701, DType::f32), 0.1);
  const Tensor b = normal({V}, 702, DType::f32);
  const Tensor t = make_targets(N, V, -100, DType::i64, 703);
  Allocator& alloc = Allocator::get(Device::cpu());
  auto peak_of = [&](bool fused) {
    Tensor xl = x.detach().clone().set_requires_grad(true);
    Tensor wl = w.detach().clone().set_requires_grad(true);
    Tensor bl = b.detach().clone().set_requires_grad(true);
    const std::size_t base = alloc.stats().live_bytes;
    alloc.reset_peak();
    {
      const Tensor loss = fused ? ops::fused_linear_cross_entropy(xl, wl, bl, t, Reduction::mean, -100, chunk)
                                : ops::cross_entropy(ops::linear(xl, wl, bl), t);
      loss.backward();
    }
    const std::size_t peak = alloc.stats().peak_bytes - base;
    EXPECT_TRUE(xl.grad().defined() && wl.grad().defined() && bl.grad().defined());
    return peak;
  };
  const std::size_t fused = peak_of(true), unfused = peak_of(false);
  const std::size_t logits_bytes = static_cast<std::size_t>(N * V) * sizeof(float);  // 10.24 MB
  const std::size_t chunk_bytes = static_cast<std::size_t>(chunk * V) * sizeof(float);
  RecordProperty("fused_peak_bytes", std::to_string(fused));
  RecordProperty("unfused_peak_bytes", std::to_string(unfused));
  std::printf("peak bytes: fused %zu, unfused %zu, logits %zu, chunk %zu\n", fused, unfused, logits_bytes,
              chunk_bytes);
  ASSERT_GT(unfused, fused);
  EXPECT_GT(unfused - fused, logits_bytes - chunk_bytes);
}

TEST(FusedLinearCrossEntropy, NarrowRowsEqualTheirWidenedF32Run) {
  // bf16/f16 x is widened exactly to f32, so the loss and dweight must equal the f32 run on the widened x bit
  // for bit, and dx must be that run's dx rounded once to x's dtype. Chunk 7 does not divide N.
  for (DType narrow : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(narrow));
    const Tensor x = normal({50, 12}, 900, DType::f32).to(narrow), w = normal({23, 12}, 901, DType::f32);
    const Tensor t = make_targets(50, 23, -100, DType::i64, 902);
    const Tensor up = full({}, 0.7, DType::f32);
    const Result n = run(true, x, w, Tensor(), t, Reduction::mean, -100, 7, up);
    const Result f = run(true, x.to(DType::f32), w, Tensor(), t, Reduction::mean, -100, 7, up);
    EXPECT_EQ(n.loss.dtype(), DType::f32);
    EXPECT_EQ(n.loss.item(), f.loss.item());
    ASSERT_EQ(n.dx.dtype(), narrow);
    EXPECT_EQ(values_of(n.dx), values_of(f.dx.to(narrow)));
    EXPECT_EQ(values_of(n.dw), values_of(f.dw));
  }
}

// A weight stored in bf16 (no f32 master): the GEMMs read it as it is and its gradient comes back in bf16, summed
// in f32 4096 rows of V at a time (V = 4100: two blocks, the second of 4 rows) and rounded once per chunk of N.
// Against the same values with the weight widened to f32: the logits are the same products (loss to f32
// rounding); dx and dW see dlogits rounded to bf16 and dW its per-chunk rounding, a few bf16 ulps normwise.
TEST(FusedLinearCrossEntropy, Bf16WeightGetsABf16GradientCloseToTheWidenedRun) {
  const std::int64_t N = 40, C = 8, V = 4100;
  const Tensor x = normal({N, C}, 910, DType::f32).to(DType::bf16);
  const Tensor w = ops::mul(normal({V, C}, 911, DType::f32), 0.3).to(DType::bf16);
  const Tensor t = make_targets(N, V, -100, DType::i64, 912);
  const Tensor up = full({}, 0.7, DType::f32);
  const Result n = run(true, x, w, Tensor(), t, Reduction::mean, -100, 7, up);
  const Result f = run(true, x, w.to(DType::f32), Tensor(), t, Reduction::mean, -100, 7, up);
  ASSERT_EQ(n.dw.dtype(), DType::bf16);
  EXPECT_NEAR(n.loss.item(), f.loss.item(), 1e-5 * std::abs(f.loss.item()));
  for (const auto& [what, got, want] : {std::tuple{"dx", n.dx, f.dx}, std::tuple{"dweight", n.dw, f.dw}}) {
    const std::vector<double> a = values_of(got), e = values_of(want);
    double diff = 0, ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff += (a[i] - e[i]) * (a[i] - e[i]);
      ref += e[i] * e[i];
    }
    EXPECT_LE(std::sqrt(diff), 1e-2 * std::sqrt(ref)) << what;
  }
  const std::vector<double> dw = values_of(n.dw.narrow(0, 4096, 4)), want = values_of(f.dw.narrow(0, 4096, 4));
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], want[i], 1e-2 * std::abs(want[i]) + 1e-6) << i;
  expect_error([&] { ops::fused_linear_cross_entropy(x.to(DType::f16), w, Tensor(), t); }, {"weight", "bf16", "f16"});
}

TEST(FusedLinearCrossEntropy, RejectsBadArguments) {
  const Tensor x = normal({4, 8}, 800, DType::f32), w = normal({5, 8}, 801, DType::f32), b = normal({5}, 802, DType::f32);
  const Tensor t = tensor(std::vector<std::int64_t>{0, 1, 4, -100}, {4});
  const char* op = "fused_linear_cross_entropy";
  expect_error([&] { ops::fused_linear_cross_entropy(x.to(DType::f64), w, b, t); }, {op, "x", "f32, bf16 or f16", "f64"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, w.to(DType::bf16), b, t); }, {op, "weight", "bf16"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, w, b.to(DType::f64), t); }, {op, "bias", "f64"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, normal({5, 9}, 803, DType::f32), b, t); },
               {op, "[4, 8]", "[5, 9]"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, w, normal({6}, 804, DType::f32), t); }, {op, "[6]", "[5, 8]"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, w, b, tensor(std::vector<std::int64_t>{0, 1}, {2})); },
               {op, "[4, 8]", "[2]"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, w, b, t.to(DType::f32)); }, {op, "i32 or i64"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, w, b, tensor(std::vector<std::int64_t>{0, 5, 1, 2}, {4})); },
               {op, "target 5", "position 1", "[0, 5)"});
  expect_error([&] { ops::fused_linear_cross_entropy(x, w, b, t, Reduction::mean, -100, 0); }, {op, "chunk_rows"});
  expect_error([&] { ops::fused_linear_cross_entropy(x.reshape({32}), w, b, t); }, {op, "[32]"});
}

// The chunk a byte budget allows: the most rows whose f32 logits fit, but never under 16.
TEST(FusedLinearCrossEntropy, HeadChunkRowsFitTheBudget) {
  for (const std::int64_t vocab : {64, 4096, 50257, 128256}) {
    for (const std::size_t budget : {std::size_t{1} << 20, std::size_t{32} << 20}) {
      const std::int64_t rows = ops::fused_head_chunk_rows(vocab, budget);
      const auto bytes = [&](std::int64_t r) { return static_cast<std::size_t>(r * vocab) * sizeof(float); };
      if (rows > 16) {
        EXPECT_LE(bytes(rows), budget) << vocab;
        EXPECT_GT(bytes(rows + 1), budget) << vocab;
      } else {
        EXPECT_EQ(rows, 16);
        EXPECT_GT(bytes(17), budget) << vocab;
      }
    }
  }
  EXPECT_THROW(ops::fused_head_chunk_rows(0), Error);
}

}  // namespace
}  // namespace memtrain
