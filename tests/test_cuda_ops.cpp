// The tensor-level nn ops on a CUDA device against the same ops on the CPU, end to end through autograd:
// softmax, log_softmax, cross_entropy, gelu, dropout, embedding, matmul and scaled_dot_product_attention
// (layer_norm and rms_norm: tests/test_norm.cpp). Helpers: tests/cuda_compare.h. Each case builds CPU leaves and cuda:0 copies of them, runs the op on
// both, calls y.backward(w) with one random w (the gradient of sum(y * w)) and compares the output and
// every input gradient normwise: ||cuda - cpu|| / ||cpu||, NaN only where the CPU has NaN.
// Tolerances, and why:
//   f32  out 2e-5, grads 1e-4: both devices compute in f32 with different summation orders (rows of up to
//        4097 elements, attention over up to 127 keys), a few ulps per element.
//   bf16 out, grads 1e-2: both devices widen the same bf16 values to f32 and round once at the end, so
//        the difference is about one bf16 rounding (2^-9 relative) on some elements.
//   f16  the same, with f16's finer rounding (2^-12 relative); the bf16 bound is kept (generous).
//   dropout: bit-identical (same Philox mask, one f32 multiply), and the same RNG state afterwards.
// Before each CUDA run the device allocator's cache is filled with 0xFF blocks (NaN in f32, bf16 and f16) of
// the sizes about to be allocated, so an element a kernel never writes shows up as NaN.
// Every test needs a device (a CUDA tensor cannot exist without one) and skips cleanly without it.
#include "cuda_compare.h"

#include "memtrain/autograd/engine.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/shape.h"

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

using ops::Reduction;
using test_support::compare_with_cpu;
using test_support::expect_normwise;
using test_support::host_values;
using test_support::kCuda;
using test_support::kDtypes;
using test_support::name_of;
using test_support::poison_device_cache;
using test_support::random_normal;
using test_support::random_uniform;
using test_support::tolerance;
using test_support::Tolerance;

// ---- inputs ----

// Indices in [0, n) (each replaced by `ignore` with probability ignore_p), as i32 or i64.
Tensor random_indices(const Shape& shape, std::int64_t n, DType dtype, std::uint64_t seed, double ignore_p = 0.0,
                      std::int64_t ignore = -100) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, n - 1);
  std::bernoulli_distribution drop(ignore_p);
  std::vector<std::int64_t> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = drop(rng) ? ignore : dist(rng);
  return from_buffer(v.data(), shape, DType::i64, dtype);
}

// ---- comparing ----

void expect_identical(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = host_values(got), w = host_values(want);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == w[i]) && !(std::isnan(g[i]) && std::isnan(w[i]))) first = bad++ == 0 ? i : first;
  EXPECT_EQ(bad, 0u) << what << ": first difference at " << first << " (got " << (bad ? g[first] : 0.0) << ", want "
                     << (bad ? w[first] : 0.0) << ")";
}

// Expects f to throw memtrain::Error whose message contains every needle.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected memtrain::Error mentioning " << needles.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << msg << "' lacks '" << n << "'";
  }
}

// ---- softmax ----

TEST(CudaOpsSoftmax, SoftmaxAndLogSoftmaxMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    Shape shape;
    std::int64_t dim;
  };
  // The last four reduce over a dim followed by others: moved last by a transposed copy and back.
  const std::vector<Case> cases = {{{1, 1}, -1}, {{3, 5}, 1},    {{127, 1000}, -1}, {{2, 64, 768}, -1},
                                   {{4097}, 0},  {{5, 7, 1}, 1}, {{2, 3, 1, 1}, 1}, {{4, 6}, 0},
                                   {{3, 5, 7}, 1}, {{2, 3, 4, 5}, 0}, {{33, 2, 65}, -2}};
  std::uint64_t seed = 300;
  for (DType dtype : kDtypes) {
    for (const Case& c : cases) {
      const Tensor x = random_normal(c.shape, dtype, ++seed, 3.0f);
      const std::int64_t dim = c.dim;
      compare_with_cpu("softmax dim " + std::to_string(dim) + " " + name_of(dtype, c.shape), {x}, {true},
                       [dim](const std::vector<Tensor>& in) { return ops::softmax(in[0], dim); }, tolerance(dtype),
                       seed);
      compare_with_cpu("log_softmax dim " + std::to_string(dim) + " " + name_of(dtype, c.shape), {x}, {true},
                       [dim](const std::vector<Tensor>& in) { return ops::log_softmax(in[0], dim); },
                       tolerance(dtype), seed);
    }
    // A transposed (non-contiguous) input over its last dim.
    const Tensor x = random_normal({9, 13}, dtype, ++seed, 3.0f);
    compare_with_cpu("softmax of a transposed input " + name_of(dtype, {13, 9}), {x}, {true},
                     [](const std::vector<Tensor>& in) { return ops::softmax(in[0].t(), -1); }, tolerance(dtype), seed);
  }
}

// ---- cross entropy ----

TEST(CudaOpsLoss, CrossEntropyMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    std::int64_t N, V;
    double ignore_p;
  };
  const std::vector<Case> cases = {{1, 1, 0.0}, {3, 5, 0.0}, {127, 33, 0.2}, {128, 1000, 0.1}, {4097, 7, 0.05},
                                   {5, 11, 1.0}};  // the last: every target ignored (mean is NaN)
  std::uint64_t seed = 400;
  for (DType dtype : kDtypes) {
    for (DType index_dtype : {DType::i32, DType::i64}) {
      for (const Case& c : cases) {
        const Tensor logits = random_normal({c.N, c.V}, dtype, ++seed, 2.0f);
        const Tensor targets = random_indices({c.N}, c.V, index_dtype, ++seed, c.ignore_p, -100);
        for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
          const std::string name = std::string("cross_entropy ") +
                                   (r == Reduction::mean ? "mean " : r == Reduction::sum ? "sum " : "none ") +
                                   std::string(dtype_name(index_dtype)) + " targets, " + name_of(dtype, {c.N, c.V}) +
                                   " ignored p=" + std::to_string(c.ignore_p);
          compare_with_cpu(name, {logits, targets}, {true, false},
                           [r](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1], r, -100); },
                           tolerance(dtype), seed);
        }
      }
    }
  }
}

// sum() of the per-row losses hands back an expanded (stride 0) gradient; the CUDA backward reads it in
// place (f32) or through its one value (bf16). Built here directly with expand().
TEST(CudaOpsLoss, CrossEntropyNoneTakesAnExpandedGradient) {
  SKIP_WITHOUT_DEVICE();
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::int64_t N = 37, V = 50;
    const Tensor logits = random_normal({N, V}, dtype, 501, 2.0f);
    const Tensor targets = random_indices({N}, V, DType::i64, 502, 0.1);
    Tensor lc = logits.detach(), ld = logits.detach().to(kCuda);
    lc.set_requires_grad(true);
    ld.set_requires_grad(true);
    const Tensor yc = ops::cross_entropy(lc, targets, Reduction::none);
    const Tensor yd = ops::cross_entropy(ld, targets.to(kCuda), Reduction::none);
    yc.backward(full({}, 0.75, dtype).expand({N}));
    yd.backward(full({}, 0.75, dtype, kCuda).expand({N}));
    expect_normwise(yd, yc, tolerance(dtype).out, "losses");
    expect_normwise(ld.grad(), lc.grad(), tolerance(dtype).grad, "dlogits");
  }
}

// ---- gelu ----

TEST(CudaOpsUnary, GeluTanhMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<Shape> shapes = {{1}, {3}, {127, 5}, {2, 64, 3072}, {4097}};
  std::uint64_t seed = 600;
  for (DType dtype : kDtypes) {
    for (const Shape& shape : shapes) {
      const Tensor x = random_normal(shape, dtype, ++seed, 3.0f);
      compare_with_cpu("gelu " + name_of(dtype, shape), {x}, {true},
                       [](const std::vector<Tensor>& in) { return ops::gelu(in[0], ops::GeluApproximation::tanh); },
                       tolerance(dtype), seed);
    }
  }
}

// ---- dropout ----

// The same seed gives the same mask on both devices, the backward regenerates it, and both paths take the
// same number of Philox blocks from the default stream.
TEST(CudaOpsDropout, SameSeedSameMaskAsCpu) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<Shape> shapes = {{1}, {3}, {1000}, {2, 64, 768}, {4097}};
  std::uint64_t seed = 700;
  for (DType dtype : kDtypes) {
    for (const Shape& shape : shapes) {
      for (double p : {0.1, 0.5}) {
        SCOPED_TRACE("dropout p=" + std::to_string(p) + " " + name_of(dtype, shape));
        // Nonzero inputs, so a zero in the output is a dropped element.
        const Tensor x = random_uniform(shape, dtype, ++seed, 0.25f, 2.0f);
        const Tensor w = random_normal(shape, dtype, ++seed);
        Tensor xc = x.detach(), xd = x.detach().to(kCuda);
        xc.set_requires_grad(true);
        xd.set_requires_grad(true);
        const std::uint64_t rng_seed = 1234 + seed;

        manual_seed(rng_seed);
        set_rng_state({rng_seed, 17});  // a non-zero offset, as after earlier random ops
        const Tensor yc = ops::dropout(xc, p, true);
        const RngState after_cpu = get_rng_state();

        set_rng_state({rng_seed, 17});
        poison_device_cache({x.nbytes()});
        const Tensor yd = ops::dropout(xd, p, true);
        const RngState after_cuda = get_rng_state();
        EXPECT_EQ(after_cuda.seed, after_cpu.seed);
        EXPECT_EQ(after_cuda.offset, after_cpu.offset);
        expect_identical(yd, yc, "output");

        // The mask kept some and dropped some (n large enough), and dropped exactly where the CPU did.
        const std::vector<double> vals = host_values(yd);
        std::size_t dropped = 0;
        for (double v : vals) dropped += v == 0.0;
        if (vals.size() >= 1000) {
          EXPECT_GT(dropped, 0u);
          EXPECT_LT(dropped, vals.size());
        }

        yc.backward(w);
        poison_device_cache({x.nbytes()});
        yd.backward(w.to(kCuda));
        expect_identical(xd.grad(), xc.grad(), "gradient");
      }
    }
  }
}

TEST(CudaOpsDropout, NotTrainingIsIdentity) {
  SKIP_WITHOUT_DEVICE();
  const Tensor x = random_normal({4, 5}, DType::f32, 750).to(kCuda);
  const RngState before = get_rng_state();
  EXPECT_TRUE(ops::dropout(x, 0.5, false).shares_storage_with(x));
  EXPECT_TRUE(ops::dropout(x, 0.0, true).shares_storage_with(x));
  EXPECT_EQ(get_rng_state().offset, before.offset);
}

// ---- embedding ----

TEST(CudaOpsEmbedding, ForwardBackwardMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    std::int64_t V, C;
    Shape index_shape;
    std::int64_t index_range;  // indices drawn from [0, index_range): small ranges repeat rows
  };
  const std::vector<Case> cases = {{1, 1, {1}, 1},          {7, 5, {3}, 7},           {50, 768, {2, 64}, 50},
                                   {1000, 3, {4097}, 1000}, {1000, 33, {127}, 4},     {9, 4, {0}, 9}};
  std::uint64_t seed = 800;
  for (DType dtype : kDtypes) {
    for (DType index_dtype : {DType::i32, DType::i64}) {
      for (const Case& c : cases) {
        const Tensor weight = random_normal({c.V, c.C}, dtype, ++seed);
        const Tensor idx = random_indices(c.index_shape, c.index_range, index_dtype, ++seed);
        compare_with_cpu("embedding " + name_of(dtype, {c.V, c.C}) + " indices " + std::string(dtype_name(index_dtype)) + " " +
                             shape_str(c.index_shape),
                         {weight, idx}, {true, false},
                         [](const std::vector<Tensor>& in) { return ops::embedding(in[0], in[1]); }, tolerance(dtype),
                         seed);
      }
    }
  }
}

// ---- matmul ----

// 2-D products (cuBLAS), a batch against one 2-D B (one GEMM over the stacked rows, or a packed copy of A when
// its matrices do not stack), batched products (strided-batched cuBLASLt) and transposed views of either side.
TEST(CudaOpsMatmul, MatmulMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    std::string name;
    Shape a, b;
    std::function<Tensor(const Tensor&, const Tensor&)> product;
  };
  const auto plain = [](const Tensor& a, const Tensor& b) { return ops::matmul(a, b); };
  const std::vector<Case> cases = {
      {"2-D", {5, 7}, {7, 3}, plain},
      {"1x1", {1, 1}, {1, 1}, plain},
      {"2-D odd", {64, 33}, {33, 65}, plain},
      {"batch x 2-D", {2, 5, 7}, {7, 3}, plain},
      {"batch x weight.t()", {2, 5, 7}, {3, 7}, [](const Tensor& a, const Tensor& w) { return ops::matmul(a, w.t()); }},
      {"unstacked batch x 2-D", {5, 2, 7}, {7, 3},
       [](const Tensor& a, const Tensor& b) { return ops::matmul(a.transpose(0, 1), b); }},
      {"batched", {3, 4, 6}, {3, 6, 5}, plain},
      {"batched 4-D", {2, 3, 4, 6}, {2, 3, 6, 5}, plain},
      {"batched transposed views", {3, 6, 4}, {3, 5, 6},
       [](const Tensor& a, const Tensor& b) { return ops::matmul(a.transpose(-1, -2), b.transpose(-1, -2)); }},
      {"batched single row", {4, 1, 9}, {4, 9, 2}, plain},
  };
  std::uint64_t seed = 1200;
  for (DType dtype : kDtypes) {
    for (const Case& c : cases) {
      const Tensor a = random_normal(c.a, dtype, ++seed), b = random_normal(c.b, dtype, ++seed);
      const auto product = c.product;
      compare_with_cpu("matmul " + c.name + " " + name_of(dtype, c.a) + " x " + shape_str(c.b), {a, b}, {true, true},
                       [product](const std::vector<Tensor>& in) { return product(in[0], in[1]); }, tolerance(dtype),
                       seed);
    }
    // k = 0: an empty sum, zeros (cuBLASLt itself refuses k = 0).
    const Tensor a = random_normal({2, 3, 0}, dtype, ++seed), b = random_normal({2, 0, 4}, dtype, ++seed);
    const Tensor y = ops::matmul(a.to(kCuda), b.to(kCuda)).to(Device::cpu()).to(DType::f32);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
    for (std::int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data<float>()[i], 0.0f) << "k=0 element " << i;
  }
}

// ---- attention ----

struct AttentionCase {
  std::int64_t B, H, T, D;
};
const std::vector<AttentionCase> kAttentionCases = {
    {1, 1, 1, 32}, {2, 3, 17, 64}, {1, 2, 127, 128}, {2, 12, 64, 64}};  // the last: GPT-2 small, C = 768

// Independent q, k, v leaves [B, H, T, D]; the output is read as [B, T, H * D] (a view of its storage).
TEST(CudaOpsAttention, SeparateQkvMatchCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 900;
  for (DType dtype : kDtypes) {
    for (const AttentionCase& c : kAttentionCases) {
      for (bool causal : {true, false}) {
        const Shape shape = {c.B, c.H, c.T, c.D};
        const Tensor q = random_normal(shape, dtype, ++seed), k = random_normal(shape, dtype, ++seed),
                     v = random_normal(shape, dtype, ++seed);
        const std::int64_t B = c.B, T = c.T, C = c.H * c.D;
        Tolerance tol = tolerance(dtype);
        if (dtype == DType::f32) tol.out = 5e-5;  // softmax-weighted sums over up to 127 keys
        compare_with_cpu(std::string("attention separate ") + (causal ? "causal " : "full ") + name_of(dtype, shape),
                         {q, k, v}, {true, true, true},
                         [=](const std::vector<Tensor>& in) {
                           return ops::scaled_dot_product_attention(in[0], in[1], in[2], causal)
                               .transpose(1, 2)
                               .reshape({B, T, C});
                         },
                         tol, seed);
      }
    }
  }
}

// A GPT block's layout: q, k, v are head views of one [B, T, 3C] projection (split, view, transpose); the
// gradient comes back as the [B, T, 3C] gradient of the projection.
TEST(CudaOpsAttention, FusedQkvProjectionMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  std::uint64_t seed = 950;
  for (DType dtype : kDtypes) {
    for (const AttentionCase& c : kAttentionCases) {
      const std::int64_t B = c.B, H = c.H, T = c.T, D = c.D, C = c.H * c.D;
      const Tensor qkv = random_normal({B, T, 3 * C}, dtype, ++seed);
      Tolerance tol = tolerance(dtype);
      if (dtype == DType::f32) tol.out = 5e-5;
      compare_with_cpu("attention fused qkv " + name_of(dtype, {B, H, T, D}), {qkv}, {true},
                       [=](const std::vector<Tensor>& in) {
                         const std::vector<Tensor> parts = ops::split(in[0], {C, C, C}, -1);
                         const Tensor q = parts[0].view({B, T, H, D}).transpose(1, 2);
                         const Tensor k = parts[1].view({B, T, H, D}).transpose(1, 2);
                         const Tensor v = parts[2].view({B, T, H, D}).transpose(1, 2);
                         return ops::scaled_dot_product_attention(q, k, v, true).transpose(1, 2).reshape({B, T, C});
                       },
                       tol, seed);
    }
  }
}

// ---- what the CUDA branch refuses, with a message naming the op ----

TEST(CudaOpsRefusals, UnsupportedCasesThrowClearly) {
  SKIP_WITHOUT_DEVICE();
  const Tensor x = random_normal({4, 6}, DType::f32, 1000).to(kCuda);

  // dtypes the kernels do not take.
  const Tensor x64 = random_normal({4, 6}, DType::f64, 1002).to(kCuda);
  expect_error([&] { ops::gelu(x64); }, {"gelu: ", "dtype f64 on cuda:0 is not supported yet"});
  expect_error([&] { ops::dropout(x64, 0.5); }, {"dropout: ", "dtype f64 on cuda:0 is not supported yet"});

  // Non-contiguous inputs (no strided copy on the device yet).
  const Tensor xt = x.t();
  expect_error([&] { ops::gelu(xt); }, {"gelu: ", "non-contiguous input on cuda:0 is not supported yet"});

  // tanh-GELU only.
  expect_error([&] { ops::gelu(x, ops::GeluApproximation::none); },
               {"gelu: ", "on cuda:0 is not supported yet", "tanh"});

  // Attention head dims other than 32, 64, 128.
  const Tensor q48 = random_normal({1, 2, 5, 48}, DType::f32, 1003).to(kCuda);
  expect_error([&] { ops::scaled_dot_product_attention(q48, q48, q48); },
               {"scaled_dot_product_attention: ", "D=48 on cuda:0 is not supported yet"});

  // Mixed devices.
  const Tensor q = random_normal({1, 2, 5, 32}, DType::f32, 1004);
  expect_error([&] { ops::scaled_dot_product_attention(q.to(kCuda), q, q.to(kCuda)); },
               {"scaled_dot_product_attention: ", "device mismatch"});
  const Tensor targets = random_indices({4}, 6, DType::i64, 1005);
  expect_error([&] { ops::cross_entropy(x, targets); }, {"cross_entropy: ", "cuda:0", "cpu", "one device"});
  expect_error([&] { ops::cross_entropy(x.to(Device::cpu()), targets.to(kCuda)); },
               {"cross_entropy: ", "one device"});
  expect_error([&] { ops::embedding(x, targets); }, {"embedding: ", "cuda:0", "cpu", "one device"});

  // Indices are range-checked on CUDA as on the CPU.
  const Tensor bad_targets = from_buffer(std::vector<std::int64_t>{0, 1, 6, 2}.data(), {4}, DType::i64, DType::i64, kCuda);
  expect_error([&] { ops::cross_entropy(x, bad_targets); }, {"cross_entropy: ", "target 6", "out of range [0, 6)"});
  expect_error([&] { ops::embedding(x, bad_targets); }, {"embedding: ", "index 6", "out of range [0, 4)"});
  // Non-contiguous targets on the device.
  const Tensor targets2 = random_indices({4, 2}, 6, DType::i64, 1006).to(kCuda);
  expect_error([&] { ops::cross_entropy(x, targets2.select(1, 0)); },
               {"cross_entropy: ", "non-contiguous targets on cuda:0 are not supported yet"});
}

}  // namespace
}  // namespace memtrain
