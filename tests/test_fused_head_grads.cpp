// The fused LM head's two ways to its gradients (ops/fused_loss.h): made in the forward for a declared seed
// (ops::LossGradientSeed), or recomputed in the backward. They must give the same bits (f32, bf16 and f16 rows,
// mean and sum, ignore_index, bias, chunks that do not divide N), both must match a float64 reference, the
// recompute must be what runs when the loss feeds another op (or the reduction is none), and under bf16
// autocast the head's GEMMs run in bf16 and stay within bf16 rounding of the reference. Through the Trainer,
// head_gradients_in_forward on and off train to the same bits with gradient accumulation, the fp16 loss scaler,
// bf16 autocast and activation checkpointing.
#include "op_test_util.h"

#include "core/backend.h"
#include "memtrain/amp/autocast.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/train/train.h"

#include "tiny_lm.h"
#include "token_dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using ops::Reduction;
using testing::normal;
using testing::values_of;

constexpr std::int64_t kIgnore = -100;

Tensor make_targets(std::int64_t N, std::int64_t V, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> cls(0, V - 1);
  std::uniform_int_distribution<int> coin(0, 4);
  std::vector<std::int64_t> v(static_cast<std::size_t>(N));
  for (auto& t : v) t = coin(gen) == 0 ? kIgnore : cls(gen);
  return tensor(v, {N}).to(DType::i64);
}

struct Case {
  Tensor x, w, b, t;  // x [N, C] (any float dtype), w [V, C] f32, b [V] f32 or undefined, t [N]
};

Case make_case(std::int64_t N, std::int64_t C, std::int64_t V, DType xdtype, bool bias, std::uint32_t seed) {
  return {normal({N, C}, seed, DType::f32).to(xdtype), ops::mul(normal({V, C}, seed + 1, DType::f32), 0.3),
          bias ? normal({V}, seed + 2, DType::f32) : Tensor(), make_targets(N, V, seed + 3)};
}

struct Result {
  Tensor loss, dx, dw, db;
  std::int64_t recomputes = 0;  // how many of the head's backwards recomputed the logits
};

// The head on fresh leaves; `seed` declared (or not) around the forward; `then` maps the loss to what is
// backwarded (the identity when the loss is the last op); backward seeded with `up`. With `autocast` bf16/f16
// the forward runs under amp::Autocast, with the head's GEMMs in that dtype when `narrow_gemms`.
Result run(const Case& c, Reduction r, std::int64_t chunk, std::optional<double> seed, double up,
           const std::function<Tensor(const Tensor&)>& then = nullptr, DType autocast = DType::f32,
           bool narrow_gemms = true) {
  Tensor xl = c.x.detach().clone().set_requires_grad(true);
  Tensor wl = c.w.detach().clone().set_requires_grad(true);
  Tensor bl = c.b.defined() ? c.b.detach().clone().set_requires_grad(true) : Tensor();
  Tensor loss, out;
  {
    std::optional<amp::Autocast> cast;
    std::optional<ops::HeadGemmsInComputeDtype> narrow;
    if (autocast != DType::f32) cast.emplace(autocast);
    if (autocast != DType::f32 && narrow_gemms) narrow.emplace();
    std::optional<ops::LossGradientSeed> declared;
    if (seed) declared.emplace(*seed);
    loss = ops::fused_linear_cross_entropy(xl, wl, bl, c.t, r, kIgnore, chunk);
    out = then ? then(loss) : loss;
  }
  const std::int64_t before = ops::fused_head_recomputes();
  out.backward(full(out.shape(), up, DType::f32));
  return {loss.detach(), xl.grad(), wl.grad(), bl.defined() ? bl.grad() : Tensor(),
          ops::fused_head_recomputes() - before};
}

void expect_same_bits(const Result& a, const Result& b) {
  EXPECT_EQ(values_of(a.loss), values_of(b.loss)) << "loss";
  ASSERT_EQ(a.dx.dtype(), b.dx.dtype());
  EXPECT_EQ(values_of(a.dx), values_of(b.dx)) << "dx";
  EXPECT_EQ(values_of(a.dw), values_of(b.dw)) << "dweight";
  if (a.db.defined() || b.db.defined()) EXPECT_EQ(values_of(a.db), values_of(b.db)) << "dbias";
}

// Loss and gradients of cross_entropy(x W^T + b) in float64 from the (rounded) operands, scaled by `up`.
struct Reference {
  double loss = 0;
  std::vector<double> dx, dw, db;
};

Reference reference(const Case& c, Reduction r, double up) {
  const std::int64_t N = c.x.size(0), C = c.x.size(1), V = c.w.size(0);
  const std::vector<double> x = values_of(c.x), w = values_of(c.w);
  const std::vector<double> b = c.b.defined() ? values_of(c.b) : std::vector<double>(V, 0.0);
  const std::vector<double> t = values_of(c.t);
  std::int64_t count = 0;
  for (double v : t) count += v != kIgnore;
  const double scale = r == Reduction::mean ? up / static_cast<double>(count) : up;
  Reference ref{0, std::vector<double>(N * C, 0), std::vector<double>(V * C, 0), std::vector<double>(V, 0)};
  std::vector<double> p(V);
  for (std::int64_t n = 0; n < N; ++n) {
    if (t[n] == kIgnore) continue;
    double mx = -INFINITY;
    for (std::int64_t v = 0; v < V; ++v) {
      double z = b[v];
      for (std::int64_t k = 0; k < C; ++k) z += x[n * C + k] * w[v * C + k];
      p[v] = z;
      mx = std::max(mx, z);
    }
    double sum = 0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(p[v] - mx);
    const auto target = static_cast<std::int64_t>(t[n]);
    ref.loss += mx + std::log(sum) - p[target];
    for (std::int64_t v = 0; v < V; ++v) {
      const double d = (std::exp(p[v] - mx) / sum - (v == target ? 1.0 : 0.0)) * scale;
      ref.db[v] += d;
      for (std::int64_t k = 0; k < C; ++k) {
        ref.dx[n * C + k] += d * w[v * C + k];
        ref.dw[v * C + k] += d * x[n * C + k];
      }
    }
  }
  if (r == Reduction::mean) ref.loss /= static_cast<double>(count);
  return ref;
}

// ||a - e|| <= rtol ||e||.
void expect_normwise(const Tensor& actual, const std::vector<double>& expected, double rtol, const char* what) {
  const std::vector<double> a = values_of(actual);
  ASSERT_EQ(a.size(), expected.size()) << what;
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - expected[i]) * (a[i] - expected[i]);
    ref += expected[i] * expected[i];
  }
  EXPECT_LE(std::sqrt(diff), rtol * std::sqrt(ref)) << what;
}

void expect_near_reference(const Result& got, const Reference& ref, double rtol) {
  EXPECT_NEAR(got.loss.item(), ref.loss, rtol * std::abs(ref.loss));
  expect_normwise(got.dx, ref.dx, rtol, "dx");
  expect_normwise(got.dw, ref.dw, rtol, "dweight");
  if (got.db.defined()) expect_normwise(got.db, ref.db, rtol, "dbias");
}

TEST(FusedHeadGrads, ForwardGradientsEqualTheRecomputeBitForBit) {
  std::uint32_t seed = 10;
  for (DType xdtype : {DType::f32, DType::bf16, DType::f16}) {
    for (Reduction r : {Reduction::mean, Reduction::sum}) {
      for (bool bias : {false, true}) {
        // 0.7: no power of two; 0.125: an accumulation weight; 65536: a loss scale.
        for (double up : {1.0, 0.7, 0.125, 65536.0}) {
          SCOPED_TRACE(std::string(dtype_name(xdtype)) + (r == Reduction::mean ? " mean" : " sum") +
                       (bias ? " bias" : "") + " up " + std::to_string(up));
          const Case c = make_case(37, 12, 29, xdtype, bias, seed++);
          const Result in_forward = run(c, r, 8, up, up);
          const Result recomputed = run(c, r, 8, std::nullopt, up);
          EXPECT_EQ(in_forward.recomputes, 0);
          EXPECT_EQ(recomputed.recomputes, 1);
          expect_same_bits(in_forward, recomputed);
        }
      }
    }
  }
}

TEST(FusedHeadGrads, BothWaysMatchAFloat64Reference) {
  for (Reduction r : {Reduction::mean, Reduction::sum}) {
    SCOPED_TRACE(r == Reduction::mean ? "mean" : "sum");
    const Case c = make_case(45, 16, 33, DType::f32, true, 40);
    const Reference ref = reference(c, r, 0.7);
    expect_near_reference(run(c, r, 16, 0.7, 0.7), ref, 1e-5);
    expect_near_reference(run(c, r, 16, std::nullopt, 0.7), ref, 1e-5);
  }
}

TEST(FusedHeadGrads, ALossThatFeedsAnotherOpFallsBackToTheRecompute) {
  const Case c = make_case(30, 8, 17, DType::f32, false, 60);
  // loss * 0.5 + loss^2: the head's backward receives 0.5 + 2 loss, not the declared 1.
  const auto feed = [](const Tensor& loss) { return ops::add(ops::mul(loss, 0.5), ops::mul(loss, loss)); };
  const Result declared = run(c, Reduction::mean, 8, 1.0, 1.0, feed);
  const Result undeclared = run(c, Reduction::mean, 8, std::nullopt, 1.0, feed);
  EXPECT_EQ(declared.recomputes, 1);
  expect_same_bits(declared, undeclared);
  const double l = declared.loss.item();
  expect_near_reference(declared, reference(c, Reduction::mean, 0.5 + 2 * l), 1e-5);
  // The gradient reaches the head as the declared seed after all (loss + 0 * loss): no recompute.
  const auto same_seed = [](const Tensor& loss) { return ops::add(loss, ops::mul(loss, 0.0)); };
  const Result passed_on = run(c, Reduction::mean, 8, 1.0, 1.0, same_seed);
  EXPECT_EQ(passed_on.recomputes, 0);
  expect_near_reference(passed_on, reference(c, Reduction::mean, 1.0), 1e-5);
}

TEST(FusedHeadGrads, PerRowLossesAlwaysRecompute) {
  const Case c = make_case(20, 8, 11, DType::f32, true, 70);
  Tensor xl = c.x.detach().clone().set_requires_grad(true);
  Tensor loss;
  {
    ops::LossGradientSeed declared(1.0);
    loss = ops::fused_linear_cross_entropy(xl, c.w, c.b, c.t, Reduction::none, kIgnore, 8);
  }
  const std::int64_t before = ops::fused_head_recomputes();
  loss.backward(normal({20}, 71, DType::f32));
  EXPECT_EQ(ops::fused_head_recomputes() - before, 1);
  EXPECT_TRUE(xl.grad().defined());
}

TEST(FusedHeadGrads, Bf16AutocastRunsTheGemmsInBf16) {
  // Under bf16 autocast the GEMMs read the weight cast to bf16: not the f32 head's bits, but within bf16
  // rounding of the float64 reference on the bf16 rows and the f32 weight; both gradient paths agree bit for bit.
  const Case c = make_case(40, 32, 50, DType::bf16, true, 80);
  const Reference ref = reference(c, Reduction::mean, 1.0);
  const Result in_forward = run(c, Reduction::mean, 16, 1.0, 1.0, nullptr, DType::bf16);
  const Result recomputed = run(c, Reduction::mean, 16, std::nullopt, 1.0, nullptr, DType::bf16);
  const Result f32_gemms = run(c, Reduction::mean, 16, 1.0, 1.0);
  EXPECT_EQ(in_forward.recomputes, 0);
  expect_same_bits(in_forward, recomputed);
  EXPECT_EQ(in_forward.loss.dtype(), DType::f32);
  EXPECT_EQ(in_forward.dx.dtype(), DType::bf16);
  EXPECT_EQ(in_forward.dw.dtype(), DType::f32);
  EXPECT_NE(values_of(in_forward.dw), values_of(f32_gemms.dw)) << "the head's GEMMs did not run in bf16";
  // Without HeadGemmsInComputeDtype autocast leaves the head's GEMMs in f32.
  expect_same_bits(run(c, Reduction::mean, 16, 1.0, 1.0, nullptr, DType::bf16, false), f32_gemms);
  expect_near_reference(in_forward, ref, 2e-2);
  expect_near_reference(f32_gemms, ref, 1e-2);
}

// Past 4096 classes the f32 weight is cast in blocks of 4096 rows (the logits written block by block, dx summed
// over the blocks in f32): within bf16 rounding of the float64 reference, both gradient paths bit for bit, and
// no whole bf16 copy of the weight is made (autocast's copies count as compute_weights; the block is workspace).
TEST(FusedHeadGrads, Bf16GemmsCastTheWeightABlockAtATime) {
  const Case c = make_case(12, 16, 4096 + 904, DType::bf16, true, 81);
  const Reference ref = reference(c, Reduction::mean, 1.0);
  Allocator& host = Allocator::get(Device::cpu());
  host.reset_peak();
  const std::size_t copies_before = host.stats()[MemoryCategory::compute_weights].live_bytes;
  const Result in_forward = run(c, Reduction::mean, 8, 1.0, 1.0, nullptr, DType::bf16);
  EXPECT_EQ(host.stats()[MemoryCategory::compute_weights].peak_bytes, copies_before)
      << "a copy of the weight was made";
  const Result recomputed = run(c, Reduction::mean, 8, std::nullopt, 1.0, nullptr, DType::bf16);
  EXPECT_EQ(recomputed.recomputes, 1);
  expect_same_bits(in_forward, recomputed);
  EXPECT_NE(values_of(in_forward.dw), values_of(run(c, Reduction::mean, 8, 1.0, 1.0).dw))
      << "the head's GEMMs did not run in bf16";
  expect_near_reference(in_forward, ref, 2e-2);
}

TEST(FusedHeadGrads, F16AutocastOnTheCpuKeepsF32Gemms) {
  // The CPU has no f16 GEMM (gemm_narrow_native): the head widens the rows as without autocast.
  const Case c = make_case(40, 16, 30, DType::f16, false, 90);
  expect_same_bits(run(c, Reduction::mean, 16, 1.0, 1.0, nullptr, DType::f16), run(c, Reduction::mean, 16, 1.0, 1.0));
}

TEST(FusedHeadGrads, BackendGemmTakesNarrowOperandsIntoF32) {
  // Backend::gemm_f32 with bf16 or f16 operands (read through transposed views) and beta 1: products of narrow
  // values are exact in f32, so only the f32 sums round.
  const detail::Backend& be = detail::backend_for(Device::cpu());
  EXPECT_TRUE(be.gemm_narrow_native(DType::bf16));
  EXPECT_FALSE(be.gemm_narrow_native(DType::f16));
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a_t = normal({19, 6}, 100, DType::f32).to(dt), b = normal({19, 11}, 101, DType::f32).to(dt);
    const Tensor c0 = normal({6, 11}, 102, DType::f32);
    const Tensor out = c0.clone();
    be.gemm_f32(out, a_t, b, true, false, 0.5, 1.0);  // out = 0.5 a_t^T b + out
    const std::vector<double> av = values_of(a_t), bv = values_of(b), cv = values_of(c0);
    std::vector<double> want(6 * 11);
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 11; ++j) {
        double acc = 0;
        for (int k = 0; k < 19; ++k) acc += av[k * 6 + i] * bv[k * 11 + j];
        want[i * 11 + j] = 0.5 * acc + cv[i * 11 + j];
      }
    expect_normwise(out, want, 1e-6, "out");
  }
  const Tensor f32 = normal({4, 4}, 103, DType::f32), out = Tensor::empty({4, 4}, DType::f32, Device::cpu());
  EXPECT_THROW(be.gemm_f32(out, f32.to(DType::bf16), f32, false, false, 1.0, 0.0), Error);
}

// ---- through the Trainer ----

struct TinyRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;  // after the steps
  std::int64_t recomputes = 0;              // of the head's backwards
};

// 3 steps of `config` on the tiny GPT.
TinyRun train_tiny(const train::TrainerConfig& config) {
  manual_seed(7);
  const auto gpt = test_support::make_tiny_lm(false);
  auto data = std::make_shared<test_support::TokenDataset>(32, test_support::kTinyWindow, test_support::kTinyVocab);
  train::Trainer trainer(config, gpt, test_support::tiny_lm_loss(gpt, false), data, nullptr);
  TinyRun run;
  const std::int64_t before = ops::fused_head_recomputes();
  for (int s = 0; s < 3; ++s) run.losses.push_back(trainer.train_step().loss);
  run.recomputes = ops::fused_head_recomputes() - before;
  for (const Tensor& p : gpt->parameters()) run.params.push_back(values_of(p));
  return run;
}

TEST(FusedHeadGrads, TrainerRunsTrainToTheSameBitsEitherWay) {
  struct Variant {
    const char* name;
    amp::Precision precision;
    const char* checkpoint;
    bool head_gemms_in_bf16 = false;
  };
  for (const Variant& v : {Variant{"fp32", amp::Precision::fp32, "none"}, Variant{"bf16", amp::Precision::bf16, "none"},
                           Variant{"bf16 head GEMMs", amp::Precision::bf16, "none", true},
                           Variant{"fp16", amp::Precision::fp16, "none"},
                           Variant{"fp32 full checkpointing", amp::Precision::fp32, "full"}}) {
    SCOPED_TRACE(v.name);
    train::TrainerConfig c = test_support::short_run_config();
    c.micro_batch = 3;  // 32 windows: the last micro-batch of an epoch differs, so accumulation weights vary
    c.grad_accum = 3;
    c.max_steps = 3;
    c.precision = v.precision;
    c.activation_checkpointing = ckpt::Policy::parse(v.checkpoint);
    c.head_gemms_in_compute_dtype = v.head_gemms_in_bf16;
    c.optimizer = optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
    c.head_gradients_in_forward = true;
    const auto in_forward = train_tiny(c);
    c.head_gradients_in_forward = false;
    const auto recomputed = train_tiny(c);
    EXPECT_EQ(in_forward.recomputes, 0);
    EXPECT_EQ(recomputed.recomputes, 3 * 3);  // one per micro-batch
    EXPECT_EQ(in_forward.losses, recomputed.losses);
    EXPECT_TRUE(in_forward.params == recomputed.params) << "parameters differ after 3 steps";
  }
}

}  // namespace
}  // namespace memtrain
