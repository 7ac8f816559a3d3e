// Tests of the nn ops (softmax, embedding, cross_entropy, dropout, attention, conv2d, pools; layer_norm and
// rms_norm: tests/test_norm.cpp).
// Forward values are compared with naive float64 loops written here (full T x T attention, direct
// convolution, ...), never with the kernels under test; gradients with central finite differences in
// float64 (gradcheck.h).
#include "gradcheck.h"
#include "op_test_util.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace memtrain {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::normal;
using testing::values_of;

Tensor int_tensor(const std::vector<std::int64_t>& v, const Shape& shape, DType dtype = DType::i64) {
  return from_buffer(v.data(), shape, DType::i64, dtype);
}

// ---- naive references -------------------------------------------------------------------------------

// softmax over dim of a row-major array of `shape`.
std::vector<double> naive_softmax(const std::vector<double>& x, const Shape& shape, std::int64_t dim, bool log) {
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (std::size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const std::int64_t C = shape[dim];
  std::vector<double> y(x.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      auto at = [&](std::int64_t c) { return (o * C + c) * inner + i; };
      double s = 0;
      for (std::int64_t c = 0; c < C; ++c) s += std::exp(x[at(c)]);
      for (std::int64_t c = 0; c < C; ++c) y[at(c)] = log ? x[at(c)] - std::log(s) : std::exp(x[at(c)]) / s;
    }
  return y;
}

// Full attention with the whole T x T score matrix (causal: key j visible to query i iff j <= i).
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, std::int64_t BH, std::int64_t T, std::int64_t D,
                                    bool causal) {
  std::vector<double> out(q.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (std::int64_t h = 0; h < BH; ++h) {
    const std::int64_t base = h * T * D;
    for (std::int64_t i = 0; i < T; ++i) {
      std::vector<double> s(T, -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < T; ++j) {
        if (causal && j > i) continue;
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += q[base + i * D + d] * k[base + j * D + d];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (std::int64_t j = 0; j < T; ++j) z += std::exp(s[j] - mx);
      for (std::int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (std::int64_t j = 0; j < T; ++j) acc += std::exp(s[j] - mx) / z * v[base + j * D + d];
        out[base + i * D + d] = acc;
      }
    }
  }
  return out;
}

// Direct convolution loops.
std::vector<double> naive_conv2d(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& b, std::int64_t B, std::int64_t Cin, std::int64_t H,
                                 std::int64_t W, std::int64_t Cout, std::int64_t K, std::int64_t stride,
                                 std::int64_t pad, std::int64_t groups, std::int64_t& OH, std::int64_t& OW) {
  OH = (H + 2 * pad - K) / stride + 1;
  OW = (W + 2 * pad - K) / stride + 1;
  const std::int64_t cin_g = Cin / groups, cout_g = Cout / groups;
  std::vector<double> out(B * Cout * OH * OW, 0.0);
  for (std::int64_t n = 0; n < B; ++n)
    for (std::int64_t co = 0; co < Cout; ++co) {
      const std::int64_t g = co / cout_g;
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double acc = b.empty() ? 0.0 : b[co];
          for (std::int64_t ci = 0; ci < cin_g; ++ci)
            for (std::int64_t kh = 0; kh < K; ++kh)
              for (std::int64_t kw = 0; kw < K; ++kw) {
                const std::int64_t ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x[((n * Cin + g * cin_g + ci) * H + ih) * W + iw] * w[((co * cin_g + ci) * K + kh) * K + kw];
              }
          out[((n * Cout + co) * OH + oh) * OW + ow] = acc;
        }
    }
  return out;
}

// ---- softmax ----------------------------------------------------------------------------------------

TEST(NnOpsSoftmax, ForwardMatchesNaiveOnEveryDim) {
  const Shape shape{3, 5, 4};
  const Tensor x = normal(shape, 1);
  const std::vector<double> xv = values_of(x);
  for (std::int64_t dim : {0, 1, 2}) {
    for (bool log : {false, true}) {
      const std::vector<double> ref = naive_softmax(xv, shape, dim, log);
      const Tensor y64 = log ? ops::log_softmax(x, dim) : ops::softmax(x, dim);
      expect_close(values_of(y64), ref, 1e-12, 1e-14, "f64 dim " + std::to_string(dim));
      const Tensor y32 = log ? ops::log_softmax(x.to(DType::f32), dim) : ops::softmax(x.to(DType::f32), dim);
      EXPECT_EQ(y32.dtype(), DType::f32);
      expect_close(values_of(y32), ref, 1e-5, 1e-6, "f32 dim " + std::to_string(dim));
    }
  }
}

TEST(NnOpsSoftmax, LargeLogitsDoNotOverflow) {
  const Tensor x = tensor(std::vector<double>{1000.0, 1001.0, 999.0}, {1, 3});
  const std::vector<double> y = values_of(ops::softmax(x.to(DType::f32)));
  const double z = std::exp(-1.0) + 1.0 + std::exp(-2.0);
  expect_close(y, {std::exp(-1.0) / z, 1.0 / z, std::exp(-2.0) / z}, 1e-6, 1e-7, "softmax of large logits");
}

TEST(NnOpsSoftmax, GradientsMatchFiniteDifferences) {
  const Tensor x = normal({2, 3, 4}, 2).set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::softmax(in[0], 1); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::log_softmax(in[0], -1); }, {x});
  // Through a transposed (non-contiguous) view.
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::softmax(in[0].transpose(0, 2), 0); }, {x});
}

// ---- embedding --------------------------------------------------------------------------------------

TEST(NnOpsEmbedding, GathersRowsForI32AndI64Indices) {
  const Tensor w = normal({5, 3}, 12);
  const std::vector<double> wv = values_of(w);
  const std::vector<std::int64_t> idx{4, 0, 2, 2, 1, 4};
  for (DType dt : {DType::i32, DType::i64}) {
    const Tensor y = ops::embedding(w, int_tensor(idx, {2, 3}, dt));
    ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
    std::vector<double> ref;
    for (auto i : idx)
      for (int c = 0; c < 3; ++c) ref.push_back(wv[i * 3 + c]);
    expect_close(values_of(y), ref, 0, 0, "embedding rows");
  }
}

TEST(NnOpsEmbedding, GradientAccumulatesRepeatedIndices) {
  const Tensor w = normal({6, 4}, 13).set_requires_grad(true);
  for (DType dt : {DType::i32, DType::i64}) {
    const Tensor idx = int_tensor({5, 1, 5, 0, 5, 3}, {3, 2}, dt);
    expect_gradients_match([idx](const std::vector<Tensor>& in) { return ops::embedding(in[0], idx); }, {w});
  }
}

TEST(NnOpsEmbedding, RejectsBadIndices) {
  const Tensor w = normal({5, 3}, 14, DType::f32);
  expect_error([&] { ops::embedding(w, int_tensor({1, 7, 2}, {3})); }, {"embedding", "7", "position 1", "[0, 5)"});
  expect_error([&] { ops::embedding(w, int_tensor({-1}, {1}, DType::i32)); }, {"embedding", "-1", "position 0"});
  expect_error([&] { ops::embedding(w, ones({2}, DType::f32)); }, {"embedding", "i32 or i64", "f32"});
  expect_error([&] { ops::embedding(ones({5}), int_tensor({1}, {1})); }, {"embedding", "[V, C]", "[5]"});
}

// ---- cross_entropy ----------------------------------------------------------------------------------

TEST(NnOpsCrossEntropy, ForwardMatchesNaiveForEveryReduction) {
  const std::int64_t N = 5, V = 7;
  const Tensor logits = normal({N, V}, 15);
  const std::vector<double> lv = values_of(logits);
  const std::vector<std::int64_t> tv{3, -100, 0, 6, -100};
  std::vector<double> ref(N, 0.0);
  double sum = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    if (tv[n] == -100) continue;
    double z = 0;
    for (std::int64_t v = 0; v < V; ++v) z += std::exp(lv[n * V + v]);
    ref[n] = std::log(z) - lv[n * V + tv[n]];
    sum += ref[n];
  }
  for (DType dt : {DType::i32, DType::i64}) {
    const Tensor t = int_tensor(tv, {N}, dt);
    expect_close(values_of(ops::cross_entropy(logits, t, ops::Reduction::none)), ref, 1e-12, 1e-12, "none");
    EXPECT_NEAR(ops::cross_entropy(logits, t, ops::Reduction::sum).item(), sum, 1e-12);
    EXPECT_NEAR(ops::cross_entropy(logits, t, ops::Reduction::mean).item(), sum / 3, 1e-12);
    EXPECT_NEAR(ops::cross_entropy(logits.to(DType::f32), t).item(), sum / 3, 1e-5);
  }
  // A custom ignore_index, and all targets ignored (mean is 0/0 = NaN, as in PyTorch).
  const Tensor t2 = int_tensor({3, 1, 0, 6, 1}, {N});
  EXPECT_NEAR(ops::cross_entropy(logits, t2, ops::Reduction::sum, 1).item(), sum, 1e-12);
  EXPECT_TRUE(std::isnan(
      ops::cross_entropy(logits.narrow(0, 0, 2), int_tensor({-100, -100}, {2}), ops::Reduction::mean).item()));
}

TEST(NnOpsCrossEntropy, GradientsMatchFiniteDifferences) {
  const Tensor logits = normal({4, 6}, 16).set_requires_grad(true);
  const Tensor t = int_tensor({2, -100, 5, 0}, {4});
  for (auto r : {ops::Reduction::mean, ops::Reduction::sum, ops::Reduction::none}) {
    expect_gradients_match([t, r](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], t, r); },
                           {logits});
  }
}

TEST(NnOpsCrossEntropy, RejectsBadTargets) {
  const Tensor logits = normal({3, 4}, 17, DType::f32);
  expect_error([&] { ops::cross_entropy(logits, int_tensor({0, 4, 1}, {3})); },
               {"cross_entropy", "target 4", "position 1", "[0, 4)"});
  expect_error([&] { ops::cross_entropy(logits, int_tensor({0, 1}, {2})); }, {"cross_entropy", "[3, 4]", "[2]"});
  expect_error([&] { ops::cross_entropy(logits, ones({3})); }, {"cross_entropy", "i32 or i64"});
}

// ---- dropout ----------------------------------------------------------------------------------------

TEST(NnOpsDropout, IdentityWhenPIsZeroOrNotTraining) {
  const Tensor x = normal({100}, 18, DType::f32);
  expect_close(values_of(ops::dropout(x, 0.0)), values_of(x), 0, 0, "p = 0");
  expect_close(values_of(ops::dropout(x, 0.7, /*training=*/false)), values_of(x), 0, 0, "eval");
  expect_error([&] { ops::dropout(x, 1.5); }, {"dropout", "1.5"});
}

TEST(NnOpsDropout, DropsAboutPAndScalesTheRest) {
  const std::int64_t n = 100000;
  const double p = 0.3;
  manual_seed(19);
  const Tensor x = ones({n}, DType::f32);
  const std::vector<double> y = values_of(ops::dropout(x, p));
  std::int64_t dropped = 0;
  for (double v : y) {
    if (v == 0.0) {
      ++dropped;
    } else {
      ASSERT_NEAR(v, 1.0 / (1.0 - p), 1e-6);
    }
  }
  // Binomial(n, p): 5 standard deviations.
  const double sd = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(static_cast<double>(dropped), n * p, 5 * sd);
}

TEST(NnOpsDropout, SameRngStateReplaysTheMaskAndBackwardUsesIt) {
  manual_seed(20);
  const Tensor x = normal({1000}, 21).set_requires_grad(true);
  const RngState before = get_rng_state();
  const Tensor y1 = ops::dropout(x, 0.5);
  const Tensor y2 = ops::dropout(x, 0.5);  // stream advanced: a different mask
  set_rng_state(before);
  const Tensor y3 = ops::dropout(x, 0.5);
  const std::vector<double> v1 = values_of(y1), v2 = values_of(y2), v3 = values_of(y3), xv = values_of(x);
  expect_close(v3, v1, 0, 0, "replayed mask");
  EXPECT_NE(v1, v2);
  // d(sum y1 * w)/dx = mask * 2 * w: zero exactly where y1 is zero.
  const Tensor w = normal({1000}, 22);
  y1.backward(w);
  const std::vector<double> g = values_of(x.grad()), wv = values_of(w);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double expected = v1[i] == 0.0 ? 0.0 : 2.0 * wv[i];
    ASSERT_NEAR(g[i], expected, 1e-12) << "element " << i;
  }
}

TEST(NnOpsDropout, SavesNoMask) {
  const Tensor x = normal({1 << 16}, 23, DType::f32).set_requires_grad(true);
  const MemoryStats before = memory_stats();
  const Tensor y = ops::dropout(x, 0.5);
  const MemoryStats after = memory_stats();
  // Only the output is new.
  EXPECT_EQ(after.live_bytes - before.live_bytes, y.nbytes());
}

// ---- attention --------------------------------------------------------------------------------------

TEST(NnOpsAttention, ForwardMatchesNaiveFullAttention) {
  const std::int64_t B = 2, H = 3, D = 8;
  for (std::int64_t T : {1, 5, 64, 100, 130}) {
    for (bool causal : {true, false}) {
      const Tensor q = normal({B, H, T, D}, 30 + T), k = normal({B, H, T, D}, 31 + T),
                   v = normal({B, H, T, D}, 32 + T);
      const std::vector<double> ref =
          naive_attention(values_of(q), values_of(k), values_of(v), B * H, T, D, causal);
      const std::string what = "T=" + std::to_string(T) + (causal ? " causal" : " full");
      expect_close(values_of(ops::scaled_dot_product_attention(q, k, v, causal)), ref, 1e-10, 1e-12, what + " f64");
      const Tensor y32 =
          ops::scaled_dot_product_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), causal);
      EXPECT_EQ(y32.dtype(), DType::f32);
      expect_close(values_of(y32), ref, 1e-4, 1e-5, what + " f32");
    }
  }
}

TEST(NnOpsAttention, NonContiguousInputs) {
  // [B, T, H, D] storage viewed as [B, H, T, D], as a model's QKV split produces.
  const std::int64_t B = 1, H = 2, T = 9, D = 4;
  const Tensor q = normal({B, T, H, D}, 40).transpose(1, 2), k = normal({B, T, H, D}, 41).transpose(1, 2),
               v = normal({B, T, H, D}, 42).transpose(1, 2);
  const std::vector<double> ref = naive_attention(values_of(q), values_of(k), values_of(v), B * H, T, D, true);
  expect_close(values_of(ops::scaled_dot_product_attention(q, k, v)), ref, 1e-10, 1e-12, "strided q, k, v");
}

TEST(NnOpsAttention, GradientsMatchFiniteDifferences) {
  // T = 70 spans two tiles of 64 with a partial one; T = 1 is the degenerate single-key case.
  // Odd head dim 3; two heads where causal (the mask differs per tile row, not per head).
  for (std::int64_t T : {1, 70}) {
    for (bool causal : {true, false}) {
      const std::int64_t H = causal ? 2 : 1;
      const Tensor q = normal({1, H, T, 3}, 50).set_requires_grad(true),
                   k = normal({1, H, T, 3}, 51).set_requires_grad(true),
                   v = normal({1, H, T, 3}, 52).set_requires_grad(true);
      expect_gradients_match(
          [causal](const std::vector<Tensor>& in) {
            return ops::scaled_dot_product_attention(in[0], in[1], in[2], causal);
          },
          {q, k, v}, 1e-6, 1e-5);
    }
  }
}

TEST(NnOpsAttention, SavesOTNotOTSquaredBytes) {
  const std::int64_t B = 1, H = 2, T = 512, D = 16;
  const Tensor q = normal({B, H, T, D}, 60, DType::f32).set_requires_grad(true),
               k = normal({B, H, T, D}, 61, DType::f32).set_requires_grad(true),
               v = normal({B, H, T, D}, 62, DType::f32).set_requires_grad(true);
  Allocator& alloc = Allocator::get(Device::cpu());
  Tensor out;
  std::size_t live_before = 0, peak_delta = 0, activations_delta = 0;
  {
    CategoryGuard guard(MemoryCategory::activations);
    const MemoryStats before = memory_stats();
    live_before = before.live_bytes;
    alloc.reset_peak();
    out = ops::scaled_dot_product_attention(q, k, v);
    const MemoryStats after = memory_stats();
    activations_delta = after[MemoryCategory::activations].live_bytes - before[MemoryCategory::activations].live_bytes;
    peak_delta = after.peak_bytes - live_before;
  }
  const std::size_t lse_bytes = static_cast<std::size_t>(B * H * T) * sizeof(float);
  // What stays alive for backward beyond the output: exactly one float per query row.
  EXPECT_EQ(activations_delta, out.nbytes() + lse_bytes);
  // Even transiently: output, lse and one 64 x 64 score tile per thread, far below the T x T scores.
  const std::size_t tiles = static_cast<std::size_t>(omp_get_max_threads()) * 64 * 64 * sizeof(float);
  EXPECT_LE(peak_delta, out.nbytes() + lse_bytes + tiles) << "peak grew by " << peak_delta << " bytes";
  EXPECT_LT(peak_delta, static_cast<std::size_t>(B * H * T * T) * sizeof(float) / 4);
  // And the backward still works from what was saved.
  out.backward(ops::ones_like(out));
  EXPECT_TRUE(q.grad().defined() && k.grad().defined() && v.grad().defined());
}

TEST(NnOpsAttention, RejectsMismatchedShapes) {
  const Tensor q = zeros({1, 2, 3, 4}), k = zeros({1, 2, 5, 4});
  expect_error([&] { ops::scaled_dot_product_attention(q, k, q); }, {"scaled_dot_product_attention", "[1, 2, 5, 4]"});
  expect_error([&] { ops::scaled_dot_product_attention(q, q.to(DType::f64), q); },
               {"scaled_dot_product_attention", "f32", "f64"});
  expect_error([&] { ops::scaled_dot_product_attention(zeros({2, 3, 4}), zeros({2, 3, 4}), zeros({2, 3, 4})); },
               {"scaled_dot_product_attention", "[B, H, T, D]"});
}

// ---- conv2d -----------------------------------------------------------------------------------------

TEST(NnOpsConv, ForwardMatchesDirectConvolution) {
  struct Case {
    std::int64_t B, Cin, H, W, Cout, K, stride, pad, groups;
    bool bias;
  };
  for (const Case& c : {Case{2, 4, 7, 6, 6, 3, 2, 1, 2, true}, Case{1, 3, 5, 5, 2, 3, 1, 0, 1, false},
                        Case{2, 4, 4, 3, 4, 1, 1, 0, 1, true}, Case{1, 2, 6, 6, 4, 2, 3, 1, 2, true}}) {
    const Tensor x = normal({c.B, c.Cin, c.H, c.W}, 70), w = normal({c.Cout, c.Cin / c.groups, c.K, c.K}, 71);
    const Tensor b = c.bias ? normal({c.Cout}, 72) : Tensor();
    std::int64_t OH = 0, OW = 0;
    const std::vector<double> ref = naive_conv2d(values_of(x), values_of(w), c.bias ? values_of(b) : std::vector<double>{},
                                                 c.B, c.Cin, c.H, c.W, c.Cout, c.K, c.stride, c.pad, c.groups, OH, OW);
    const Tensor y = ops::conv2d(x, w, b, c.stride, c.pad, c.groups);
    ASSERT_EQ(y.shape(), (Shape{c.B, c.Cout, OH, OW}));
    expect_close(values_of(y), ref, 1e-12, 1e-12, "conv2d f64");
    const Tensor y32 = ops::conv2d(x.to(DType::f32), w.to(DType::f32), c.bias ? b.to(DType::f32) : Tensor(),
                                   c.stride, c.pad, c.groups);
    expect_close(values_of(y32), ref, 1e-5, 1e-5, "conv2d f32");
  }
}

TEST(NnOpsConv, GradientsMatchFiniteDifferences) {
  const Tensor x = normal({2, 4, 5, 5}, 73).set_requires_grad(true);
  const Tensor w = normal({6, 2, 3, 3}, 74).set_requires_grad(true), b = normal({6}, 75).set_requires_grad(true);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], /*stride=*/2, /*padding=*/1, 2); },
      {x, w, b});
  const Tensor w1 = normal({3, 4, 1, 1}, 76).set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], Tensor()); }, {x, w1});
}

TEST(NnOpsConv, RejectsBadShapes) {
  expect_error([] { ops::conv2d(zeros({1, 3, 5, 5}), zeros({4, 2, 3, 3}), Tensor(), 1, 0, 2); },
               {"conv2d", "groups=2", "[1, 3, 5, 5]"});
  expect_error([] { ops::conv2d(zeros({1, 2, 2, 2}), zeros({4, 2, 3, 3}), Tensor()); }, {"conv2d", "does not fit"});
  // (H - KH) / stride rounds toward zero: a 2x2 kernel over a 1x1 input at stride 2 would give one output.
  expect_error([] { ops::conv2d(zeros({1, 2, 1, 1}), zeros({4, 2, 2, 2}), Tensor(), 2); }, {"conv2d", "does not fit"});
  expect_error([] { ops::conv2d(zeros({1, 2, 5, 5}), zeros({4, 2, 3, 3}), zeros({3})); }, {"conv2d", "bias", "[3]"});
}

// ---- pools ------------------------------------------------------------------------------------------

TEST(NnOpsPool, ForwardMatchesNaive) {
  const std::int64_t B = 2, C = 3, H = 7, W = 6;
  const Tensor x = normal({B, C, H, W}, 80);
  const std::vector<double> xv = values_of(x);
  struct Case {
    std::int64_t k, s, p;
  };
  for (const Case& c : {Case{2, 0, 0}, Case{3, 2, 1}, Case{3, 1, 0}}) {
    const std::int64_t stride = c.s == 0 ? c.k : c.s;
    const std::int64_t OH = (H + 2 * c.p - c.k) / stride + 1, OW = (W + 2 * c.p - c.k) / stride + 1;
    std::vector<double> mx, avg;
    for (std::int64_t pl = 0; pl < B * C; ++pl)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double m = -std::numeric_limits<double>::infinity(), s = 0;
          for (std::int64_t kh = 0; kh < c.k; ++kh)
            for (std::int64_t kw = 0; kw < c.k; ++kw) {
              const std::int64_t ih = oh * stride - c.p + kh, iw = ow * stride - c.p + kw;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              m = std::max(m, xv[(pl * H + ih) * W + iw]);
              s += xv[(pl * H + ih) * W + iw];
            }
          mx.push_back(m);
          avg.push_back(s / (c.k * c.k));
        }
    const Tensor ym = ops::max_pool2d(x, c.k, c.s, c.p), ya = ops::avg_pool2d(x, c.k, c.s, c.p);
    ASSERT_EQ(ym.shape(), (Shape{B, C, OH, OW}));
    expect_close(values_of(ym), mx, 0, 0, "max_pool2d");
    expect_close(values_of(ya), avg, 1e-12, 1e-12, "avg_pool2d");
    expect_close(values_of(ops::max_pool2d(x.to(DType::f32), c.k, c.s, c.p)), mx, 1e-6, 1e-6, "max_pool2d f32");
  }
}

TEST(NnOpsPool, GradientsMatchFiniteDifferences) {
  const Tensor x = normal({1, 2, 6, 5}, 81).set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::max_pool2d(in[0], 2); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::max_pool2d(in[0], 3, 2, 1); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::avg_pool2d(in[0], 3, 2, 1); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::avg_pool2d(in[0], 2); }, {x});
}

TEST(NnOpsPool, RejectsBadArguments) {
  expect_error([] { ops::max_pool2d(zeros({1, 1, 4, 4}), 2, 1, 2); }, {"max_pool2d", "padding 2"});
  expect_error([] { ops::avg_pool2d(zeros({4, 4}), 2); }, {"avg_pool2d", "[4, 4]"});
}

}  // namespace
}  // namespace memtrain
