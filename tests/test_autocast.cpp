// amp::Autocast: which ops run narrow, which stay f32, where gradients land, the parameter-copy cache, and
// a GPT trained under bf16 / f16 compute against the same model in f32.
#include "memtrain/amp/autocast.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/autograd/engine.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/llama.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

namespace memtrain {
namespace {

using amp::Autocast;

Tensor random_tokens(const Shape& shape, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty(shape, DType::i64);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int64_t>()[i] = static_cast<std::int64_t>(gen() % vocab);
  return t;
}

// ||a - b|| / ||b|| in float64 over any floating dtypes.
double relative_error(const Tensor& a, const Tensor& b) {
  const Tensor x = a.detach().to(DType::f64).contiguous(), y = b.detach().to(DType::f64).contiguous();
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const double d = x.data<double>()[i] - y.data<double>()[i];
    num += d * d;
    den += y.data<double>()[i] * y.data<double>()[i];
  }
  return std::sqrt(num / den);
}

TEST(Autocast, LinearRunsInBf16AndItsGradientsReachTheF32Weights) {
  manual_seed(1);
  Tensor x = randn({8, 16}).set_requires_grad(), w = randn({4, 16}).set_requires_grad(),
         b = randn({4}).set_requires_grad();
  Tensor y;
  {
    Autocast bf16(DType::bf16);
    EXPECT_EQ(amp::autocast_dtype(), DType::bf16);
    y = ops::linear(x, w, b);
  }
  EXPECT_EQ(amp::autocast_dtype(), DType::f32);
  EXPECT_EQ(y.dtype(), DType::bf16);
  ops::sum(y.to(DType::f32)).backward();
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  ASSERT_EQ(x.grad().dtype(), DType::f32);
  // d sum(x W^T + b) / dW[o, i] = sum_n x[n, i]; from bf16-rounded x: within bf16's relative precision.
  const Tensor xs = ops::sum(x.detach(), {0});
  for (std::int64_t o = 0; o < 4; ++o)
    for (std::int64_t i = 0; i < 16; ++i) {
      const double want = xs.data<float>()[i];
      EXPECT_NEAR(w.grad().data<float>()[o * 16 + i], want, 8 * 0.0078 + 0.02 * std::abs(want));
    }
  for (std::int64_t o = 0; o < 4; ++o) EXPECT_FLOAT_EQ(b.grad().data<float>()[o], 8.0f);
  // The forward against f32 math: bf16 operands (8-bit mantissa), f32 accumulation.
  EXPECT_LT(relative_error(y, ops::linear(x.detach(), w.detach(), b.detach())), 1e-2);
}

TEST(Autocast, LossOpsAndSoftmaxRunInF32) {
  manual_seed(2);
  const Tensor logits = randn({6, 10}).to(DType::bf16), targets = random_tokens({6}, 10, 3);
  Autocast bf16(DType::bf16);
  EXPECT_EQ(ops::cross_entropy(logits, targets).dtype(), DType::f32);
  EXPECT_EQ(ops::softmax(logits).dtype(), DType::f32);
  EXPECT_EQ(ops::log_softmax(logits).dtype(), DType::f32);
  // Ops outside the list keep their inputs' dtype.
  EXPECT_EQ(ops::add(logits, logits).dtype(), DType::bf16);
  EXPECT_EQ(ops::add(randn({2}), randn({2})).dtype(), DType::f32);
}

TEST(Autocast, F32GuardTurnsItOffAndF16IsAccepted) {
  manual_seed(3);
  const Tensor a = randn({4, 4}), b = randn({4, 4});
  Autocast f16(DType::f16);
  EXPECT_EQ(ops::matmul(a, b).dtype(), DType::f16);
  {
    Autocast off(DType::f32);
    EXPECT_FALSE(amp::autocast_enabled());
    EXPECT_EQ(ops::matmul(a, b).dtype(), DType::f32);
  }
  EXPECT_EQ(amp::autocast_dtype(), DType::f16);
  EXPECT_THROW(Autocast(DType::f64), Error);
  EXPECT_THROW(Autocast(DType::f8_e4m3), Error);
}

TEST(Autocast, AParameterIsCastOncePerGuardUnderComputeWeights) {
  manual_seed(4);
  Tensor w = randn({64, 32}).set_requires_grad();
  const Tensor x = randn({5, 32});
  auto& alloc = Allocator::get(Device::cpu());
  const std::size_t before = alloc.stats()[MemoryCategory::compute_weights].live_bytes;
  Tensor y1, y2;
  {
    Autocast bf16(amp::AutocastMode{DType::bf16, nullptr, amp::WeightCasts::keep_for_backward});
    y1 = ops::linear(x, w);
    y2 = ops::linear(x, w);
    // One bf16 copy of w (2 bytes per element), shared by both uses.
    EXPECT_EQ(alloc.stats()[MemoryCategory::compute_weights].live_bytes - before, 64u * 32u * 2u);
  }
  ops::sum(ops::add(y1, y2).to(DType::f32)).backward();
  // Both uses reach w through the one copy: the gradient is twice one use's.
  const Tensor xs = ops::sum(x, {0}).to(DType::bf16).to(DType::f32);
  EXPECT_NEAR(w.grad().data<float>()[0], 2 * xs.data<float>()[0], 0.05 * std::abs(xs.data<float>()[0]) + 0.05);
  y1 = Tensor();
  y2 = Tensor();
  EXPECT_EQ(alloc.stats()[MemoryCategory::compute_weights].live_bytes, before);
}

TEST(Autocast, BackwardInsideAGuardKeepsTheForwardsDtypes) {
  manual_seed(5);
  Tensor w = randn({8, 8}).set_requires_grad();
  const Tensor x = randn({3, 8});
  Autocast bf16(DType::bf16);
  const Tensor y = ops::linear(x, w);
  ops::sum(y).backward();  // the engine turns autocast off: dW is computed from the bf16 operands, then f32
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_TRUE(amp::autocast_enabled());
}

nn::GPTConfig small_gpt(double dropout) {
  nn::GPTConfig c;
  c.vocab_size = 97;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = dropout;
  return c;
}

struct GptRun {
  Tensor loss;
  std::vector<Tensor> grads;
  std::size_t activations_kept = 0;
  std::size_t weight_copies_after_forward = 0;  // compute_weights bytes alive between the forward and backward
  std::size_t weight_copies_peak = 0;           // the most compute_weights bytes alive in forward and backward
};

// One forward + backward of a fixed GPT at `dtype` (f32: no autocast; with fp8: the fp8 policy), with a
// checkpoint policy and a weight-cast policy.
GptRun gpt_step(DType dtype, const ckpt::Policy& policy, double dropout = 0.0, amp::Fp8State* fp8 = nullptr,
                amp::WeightCasts casts = amp::WeightCasts::recast) {
  manual_seed(11);
  nn::GPT model(small_gpt(dropout));
  model.set_checkpointing(policy);
  const Tensor idx = random_tokens({4, 16}, 97, 1), targets = random_tokens({4, 16}, 97, 2);
  auto& alloc = Allocator::get(Device::cpu());
  const std::size_t base = alloc.stats()[MemoryCategory::activations].live_bytes;
  const std::size_t copies_base = alloc.stats()[MemoryCategory::compute_weights].live_bytes;
  alloc.reset_peak();
  GptRun r;
  {
    CategoryGuard category(MemoryCategory::activations);
    std::optional<Autocast> guard;
    if (fp8 != nullptr) guard.emplace(amp::AutocastMode{DType::bf16, fp8, casts});
    else if (dtype != DType::f32) guard.emplace(amp::AutocastMode{dtype, nullptr, casts});
    r.loss = model.loss(idx, targets);
  }
  r.activations_kept = alloc.stats()[MemoryCategory::activations].live_bytes - base;
  r.weight_copies_after_forward = alloc.stats()[MemoryCategory::compute_weights].live_bytes - copies_base;
  r.loss.backward();
  r.weight_copies_peak = alloc.stats()[MemoryCategory::compute_weights].peak_bytes - copies_base;
  for (const Tensor& p : model.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

TEST(Autocast, GptUnderBf16AndF16TracksF32AndStoresHalfTheActivations) {
  const GptRun f32 = gpt_step(DType::f32, ckpt::Policy::none());
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const GptRun low = gpt_step(dt, ckpt::Policy::none());
    EXPECT_EQ(low.loss.dtype(), DType::f32);
    EXPECT_NEAR(low.loss.item(), f32.loss.item(), 0.01 * f32.loss.item());
    ASSERT_EQ(low.grads.size(), f32.grads.size());
    double worst = 0;
    for (std::size_t i = 0; i < low.grads.size(); ++i) {
      EXPECT_EQ(low.grads[i].dtype(), DType::f32);
      worst = std::max(worst, relative_error(low.grads[i], f32.grads[i]));
    }
    // bf16 keeps 8 mantissa bits (relative step 2^-8 = 0.4%); errors compound over the layers.
    EXPECT_LT(worst, dt == DType::bf16 ? 0.08 : 0.02) << "worst per-tensor gradient relative error";
    const double ratio = static_cast<double>(low.activations_kept) / static_cast<double>(f32.activations_kept);
    std::printf("%s: loss %.6f (f32 %.6f), worst per-tensor gradient error %.4f, activations kept %.4f of f32\n",
                dtype_name(dt).data(), low.loss.item(), f32.loss.item(), worst, ratio);
    EXPECT_GT(ratio, 0.45);
    EXPECT_LT(ratio, 0.56) << "activations kept for backward: " << low.activations_kept << " vs " << f32.activations_kept;
  }
}

// Cast lifetime: under WeightCasts::recast no bf16 copy of an f32 weight outlives the op that uses it; backward
// casts each weight again where it needs it (the copies are saved as recipes: a linear with a bias saves the copy
// itself, a linear without one a transposed view of it). The most alive at once is one linear's weight and bias, where
// keep_for_backward holds every weight's copy from the forward to backward. The recast copy has the forward's
// bits, so the gradients are identical.
TEST(Autocast, RecastWeightCopiesLiveOnlyWhileTheirOpRunsWithTheSameGradients) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const GptRun keep = gpt_step(dt, ckpt::Policy::none(), 0.0, nullptr, amp::WeightCasts::keep_for_backward);
    const GptRun recast = gpt_step(dt, ckpt::Policy::none(), 0.0, nullptr, amp::WeightCasts::recast);
    EXPECT_EQ(recast.loss.item(), keep.loss.item());
    ASSERT_EQ(recast.grads.size(), keep.grads.size());
    for (std::size_t i = 0; i < keep.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(recast.grads[i].data_ptr(), keep.grads[i].data_ptr(), keep.grads[i].nbytes()), 0) << i;

    // small_gpt: C = 32, 3 blocks, V = 97, T = 16, 2 bytes per copied element.
    const std::size_t C = 32, fc = (4 * C * C + 4 * C) * 2;  // the largest linear: mlp.fc's weight and bias
    const std::size_t block_matrices = (3 * C * C + C * C + 4 * C * C + 4 * C * C) * 2;  // qkv, proj, fc, proj
    EXPECT_EQ(recast.weight_copies_after_forward, 0u);
    EXPECT_LE(recast.weight_copies_peak, fc);
    // Backward saved every linear's weight copy (the biases' copies went with the guard's cache; the head
    // widens its input instead of casting the table).
    EXPECT_EQ(keep.weight_copies_after_forward, 3 * block_matrices);
    std::printf("%s: weight copies peak %zu B under recast, %zu B under keep (%zu B alive after the forward)\n",
                dtype_name(dt).data(), recast.weight_copies_peak, keep.weight_copies_peak,
                keep.weight_copies_after_forward);
  }
}

// The fp8 policy under recast: backward quantizes each linear's weight again (blockwise from the weight alone,
// delayed with the scale the forward used), so the FP8 codes live only while their op runs and backward keeps
// just the scales; the codes are the forward's, so the gradients are identical.
TEST(Autocast, Fp8RecastQuantizesWeightsAgainWithTheSameGradients) {
  for (amp::Fp8ScalingKind kind : {amp::Fp8ScalingKind::blockwise, amp::Fp8ScalingKind::delayed}) {
    SCOPED_TRACE(amp::fp8_scaling_name(kind));
    amp::Fp8State keep_state(amp::Fp8Recipe{.kind = kind, .delayed = {}});
    amp::Fp8State recast_state(amp::Fp8Recipe{.kind = kind, .delayed = {}});
    const GptRun keep = gpt_step(DType::bf16, ckpt::Policy::none(), 0.0, &keep_state, amp::WeightCasts::keep_for_backward);
    const GptRun recast = gpt_step(DType::bf16, ckpt::Policy::none(), 0.0, &recast_state, amp::WeightCasts::recast);
    EXPECT_EQ(recast.loss.item(), keep.loss.item());
    ASSERT_EQ(recast.grads.size(), keep.grads.size());
    for (std::size_t i = 0; i < keep.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(recast.grads[i].data_ptr(), keep.grads[i].data_ptr(), keep.grads[i].nbytes()), 0) << i;
    // small_gpt: 3 blocks of 12 C^2 weights, one byte per FP8 code, C = 32.
    const std::size_t C = 32, codes = 3 * 12 * C * C;
    EXPECT_GE(keep.weight_copies_after_forward, codes) << "keep: every linear's codes until backward";
    EXPECT_LT(recast.weight_copies_after_forward, codes / 100) << "recast: the scales only";
    EXPECT_LE(recast.weight_copies_peak, 4 * C * C + 4 * C * C / 8) << "about one linear's codes at a time";
  }
}

// A linear without a bias saves a transposed view of the weight's copy: the recast makes the view again.
TEST(Autocast, RecastRemakesASavedViewOfTheCopy) {
  manual_seed(6);
  Tensor w1 = randn({24, 16}).set_requires_grad(), w2 = randn({8, 24}).set_requires_grad();
  const Tensor x = randn({5, 16});
  std::vector<Tensor> grads[2];
  for (int k = 0; k < 2; ++k) {
    const auto casts = k == 0 ? amp::WeightCasts::keep_for_backward : amp::WeightCasts::recast;
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Tensor y;
    {
      Autocast guard(amp::AutocastMode{DType::bf16, nullptr, casts});
      y = ops::linear(ops::gelu(ops::linear(x, w1)), w2);
    }
    ops::sum(ops::mul(y, y).to(DType::f32)).backward();
    grads[k] = {w1.grad().clone(), w2.grad().clone()};
  }
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(std::memcmp(grads[0][i].data_ptr(), grads[1][i].data_ptr(), grads[0][i].nbytes()), 0) << i;
}

// LLaMA's rotary tables are f32 while q and k arrive in the compute dtype: the rows in use are cast to it.
TEST(Autocast, LlamaUnderBf16AndF16TracksF32) {
  nn::LlamaConfig config;
  config.vocab_size = 97;
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 32;
  config.intermediate_size = 48;
  const Tensor idx = random_tokens({2, 16}, 97, 3), targets = random_tokens({2, 16}, 97, 4);
  const auto step = [&](DType dt, std::vector<Tensor>& grads) {
    manual_seed(13);
    nn::Llama model(config);
    Tensor loss;
    {
      Autocast guard(dt);
      loss = model.loss(idx, targets);
    }
    loss.backward();
    for (const Tensor& p : model.parameters()) grads.push_back(p.grad().clone());
    return loss.item();
  };
  std::vector<Tensor> f32_grads;
  const double f32_loss = step(DType::f32, f32_grads);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Tensor> grads;
    EXPECT_NEAR(step(dt, grads), f32_loss, 0.01 * f32_loss);
    ASSERT_EQ(grads.size(), f32_grads.size());
    double worst = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) worst = std::max(worst, relative_error(grads[i], f32_grads[i]));
    EXPECT_LT(worst, dt == DType::bf16 ? 0.08 : 0.02) << "worst per-tensor gradient relative error";
  }
}

TEST(Autocast, GptUnderFp8TracksF32AndStoresLessThanBf16) {
  const GptRun f32 = gpt_step(DType::f32, ckpt::Policy::none());
  const GptRun bf16 = gpt_step(DType::bf16, ckpt::Policy::none());
  for (amp::Fp8ScalingKind kind : {amp::Fp8ScalingKind::blockwise, amp::Fp8ScalingKind::delayed}) {
    SCOPED_TRACE(amp::fp8_scaling_name(kind));
    amp::Fp8State fp8(amp::Fp8Recipe{.kind = kind, .delayed = {}});
    const GptRun r = gpt_step(DType::bf16, ckpt::Policy::none(), 0.0, &fp8);
    // A fresh delayed state quantizes with scale 1: values below E4M3's smallest subnormal (2^-9) vanish,
    // so the first delayed step is the coarse one; blockwise scales each tile to its range.
    EXPECT_NEAR(r.loss.item(), f32.loss.item(), 0.02 * f32.loss.item());
    double worst = 0;
    for (std::size_t i = 0; i < r.grads.size(); ++i) worst = std::max(worst, relative_error(r.grads[i], f32.grads[i]));
    if (kind == amp::Fp8ScalingKind::blockwise) EXPECT_LT(worst, 0.25) << "worst per-tensor gradient relative error";
    std::printf("fp8 %s: loss %.6f (f32 %.6f), worst per-tensor gradient error %.4f, activations kept %.4f of bf16's\n",
                amp::fp8_scaling_name(kind).c_str(), r.loss.item(), f32.loss.item(), worst,
                static_cast<double>(r.activations_kept) / static_cast<double>(bf16.activations_kept));
    // Linear inputs are saved as FP8 codes (1 byte) instead of bf16 (2).
    EXPECT_LT(r.activations_kept, bf16.activations_kept);
  }
}

// Gradients of every checkpoint policy equal the plain run's bit for bit, under bf16 or under fp8 (`fp8`).
void expect_checkpointing_bit_identical(amp::Fp8State* fp8) {
  const GptRun plain = gpt_step(DType::bf16, ckpt::Policy::none(), 0.1, fp8);
  for (const ckpt::Policy& p : {ckpt::Policy::full(), ckpt::Policy::selective()}) {
    SCOPED_TRACE(p.to_string());
    const GptRun ck = gpt_step(DType::bf16, p, 0.1, fp8);
    EXPECT_EQ(ck.loss.item(), plain.loss.item());
    ASSERT_EQ(ck.grads.size(), plain.grads.size());
    for (std::size_t i = 0; i < ck.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(ck.grads[i].data_ptr(), plain.grads[i].data_ptr(), plain.grads[i].nbytes()), 0) << i;
    EXPECT_LT(ck.activations_kept, plain.activations_kept);
  }
}

TEST(Autocast, CheckpointReRunRestoresTheForwardsComputeDtype) {
  // The re-run happens in backward, where autocast is off: it must run in bf16 again, or the recomputed
  // tensors would differ from the forward's (and their shapes' dtypes would not match the placeholders).
  expect_checkpointing_bit_identical(nullptr);
}

TEST(Autocast, CheckpointReRunRoutesLinearsThroughFp8Again) {
  amp::Fp8State fp8;
  expect_checkpointing_bit_identical(&fp8);
}

}  // namespace
}  // namespace memtrain
