// DynamicLossScaler tests. Unscaled values are checked against quotients computed here in float64, the rule
// (backoff, growth, clamps) against step counts worked out by hand, and the fp16 case against a simulated
// fp16 backward: a known f32 gradient times the scale, rounded to f16 (Inf past 65504).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "memtrain/amp/loss_scaler.h"
#include "memtrain/core/tensor.h"
#include "memtrain/train/trainer.h"
#include "op_test_util.h"

namespace memtrain::amp {
namespace {

using memtrain::testing::expect_error;
using memtrain::testing::values_of;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> random_values(std::uint32_t seed, std::size_t n, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mag(lo, hi);
  std::bernoulli_distribution negative(0.5);
  std::vector<double> out(n);
  for (double& v : out) v = negative(rng) ? -mag(rng) : mag(rng);
  return out;
}

Tensor make(const std::vector<double>& v, DType dtype) {
  return tensor(v, {static_cast<std::int64_t>(v.size())}).to(dtype);
}

// Unit roundoff of each dtype: a correctly rounded normal value is within u * |exact| of the exact one.
double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64: return std::ldexp(1.0, -53);
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    default: return 0.0;
  }
}

// ---- options ---------------------------------------------------------------------------------------------

TEST(LossScalerOptions, DefaultsMatchGradScaler) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.options().min_scale, 1.0);
  EXPECT_EQ(s.options().max_scale, 16777216.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(LossScalerOptions, BadOptionsThrowNamingTheField) {
  struct Case {
    LossScalerOptions o;
    std::string field;
  };
  auto with = [](auto edit) {
    LossScalerOptions o;
    edit(o);
    return o;
  };
  const std::vector<Case> cases = {
      {with([](auto& o) { o.init_scale = 0; }), "init_scale"},
      {with([](auto& o) { o.init_scale = -4; }), "init_scale"},
      {with([](auto& o) { o.init_scale = kInf; }), "init_scale"},
      {with([](auto& o) { o.init_scale = kNaN; }), "init_scale"},
      {with([](auto& o) { o.growth_factor = 1.0; }), "growth_factor"},
      {with([](auto& o) { o.growth_factor = 0.5; }), "growth_factor"},
      {with([](auto& o) { o.growth_factor = kInf; }), "growth_factor"},
      {with([](auto& o) { o.backoff_factor = 0.0; }), "backoff_factor"},
      {with([](auto& o) { o.backoff_factor = 1.0; }), "backoff_factor"},
      {with([](auto& o) { o.backoff_factor = kNaN; }), "backoff_factor"},
      {with([](auto& o) { o.growth_interval = 0; }), "growth_interval"},
      {with([](auto& o) { o.min_scale = 0; }), "min_scale"},
      {with([](auto& o) { o.max_scale = kInf; }), "max_scale"},
      {with([](auto& o) { o.min_scale = 131072; }), "min_scale <= init_scale"},
      {with([](auto& o) { o.max_scale = 1024; }), "init_scale <= max_scale"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    expect_error([&] { DynamicLossScaler s(c.o); }, {"DynamicLossScaler", c.field});
  }
  // The edges are allowed: init_scale == min_scale == max_scale, growth_interval 1.
  EXPECT_NO_THROW(DynamicLossScaler({.init_scale = 8, .growth_interval = 1, .min_scale = 8, .max_scale = 8}));
}

// ---- unscale ---------------------------------------------------------------------------------------------

TEST(LossScalerUnscale, PowerOfTwoScaleDividesExactlyInEveryDtype) {
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    // Scaled values of an fp16 backward: magnitudes well inside every dtype's normal range after / 1024.
    const Tensor g = make(random_values(7, 300, 1.0, 60000.0), dtype);
    const std::vector<double> before = values_of(g);
    DynamicLossScaler s({.init_scale = 1024});
    EXPECT_TRUE(s.unscale_({g, Tensor()}));  // undefined gradients are skipped
    EXPECT_EQ(g.dtype(), dtype);
    std::vector<double> expected(before.size());
    for (std::size_t i = 0; i < before.size(); ++i) expected[i] = before[i] / 1024.0;
    EXPECT_EQ(values_of(g), expected);
  }
}

TEST(LossScalerUnscale, OtherScalesAreCorrectlyRounded) {
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor g = make(random_values(11, 300, 1.0, 60000.0), dtype);
    const std::vector<double> before = values_of(g);
    const double scale = 3000.0;  // 1/3000 is not a binary fraction: every quotient rounds
    DynamicLossScaler s({.init_scale = scale});
    EXPECT_TRUE(s.unscale_({g}));
    const std::vector<double> after = values_of(g);
    const double u = unit_roundoff(dtype);
    for (std::size_t i = 0; i < before.size(); ++i) {
      const double exact = before[i] / scale;
      EXPECT_LE(std::abs(after[i] - exact), u * std::abs(exact)) << "element " << i;
    }
  }
}

TEST(LossScalerUnscale, NonContiguousGradientIsUnscaledInPlace) {
  const std::vector<double> v = random_values(3, 12, 0.5, 4.0);
  const Tensor base = tensor(v, {3, 4}).to(DType::f32);
  const Tensor view = base.transpose(0, 1);  // a strided view of base's storage
  ASSERT_FALSE(view.is_contiguous());
  DynamicLossScaler s({.init_scale = 256});
  EXPECT_TRUE(s.unscale_({view}));
  const std::vector<double> after = values_of(base);
  for (std::size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(after[i], static_cast<double>(static_cast<float>(v[i])) / 256.0) << "element " << i;
}

TEST(LossScalerUnscale, RejectsOtherDtypesChangingNothing) {
  const Tensor ok = make({4096.0, -8192.0}, DType::f32);
  const Tensor ints = tensor<std::int32_t>({1, 2, 3}, {3});
  DynamicLossScaler s({.init_scale = 1024});
  expect_error([&] { s.unscale_({ok, ints}); }, {"DynamicLossScaler::unscale_", "gradient 1", "i32"});
  EXPECT_EQ(values_of(ok), (std::vector<double>{4096.0, -8192.0}));
}

// With a scale below 1, unscaling multiplies: a finite f16 value can overflow, and the verdict must see it.
TEST(LossScalerUnscale, FiniteValueThatOverflowsWhenUnscaledIsReported) {
  const Tensor g = make({40000.0, 1.0}, DType::f16);
  DynamicLossScaler s({.init_scale = 0.5, .min_scale = 0.25});
  EXPECT_FALSE(s.unscale_({g}));
  const std::vector<double> after = values_of(g);
  EXPECT_TRUE(std::isinf(after[0]));
  EXPECT_EQ(after[1], 2.0);
}

// ---- overflow and growth ---------------------------------------------------------------------------------

TEST(LossScalerOverflow, InfOrNanGradientSkipsTheStepAndHalvesTheScale) {
  for (double poison : {kInf, -kInf, kNaN}) {
    for (DType dtype : {DType::f32, DType::f16}) {
      SCOPED_TRACE(std::to_string(poison) + " " + std::string(dtype_name(dtype)));
      // Large enough for the threaded scan (over 65536 elements), poisoned in the middle.
      std::vector<double> bad = random_values(5, 70001, 1.0, 100.0);
      bad[50000] = poison;
      const Tensor clean = make({65536.0, -131072.0}, DType::f32);
      const Tensor poisoned = make(bad, dtype);
      DynamicLossScaler s;
      EXPECT_FALSE(s.unscale_({clean, poisoned}));
      // Every gradient is still unscaled; the poisoned element stays non-finite.
      EXPECT_EQ(values_of(clean), (std::vector<double>{1.0, -2.0}));
      EXPECT_FALSE(std::isfinite(values_of(poisoned)[50000]));
      s.update(true);
      EXPECT_EQ(s.scale(), 32768.0);
      EXPECT_EQ(s.skipped_steps(), 1);
      EXPECT_EQ(s.growth_tracker(), 0);
    }
  }
}

TEST(LossScalerGrowth, GrowsExactlyAfterTheIntervalAndResetsOnOverflow) {
  DynamicLossScaler s({.init_scale = 1024, .growth_interval = 5});
  for (int i = 1; i <= 4; ++i) {
    s.update(false);
    EXPECT_EQ(s.scale(), 1024.0) << "after " << i << " finite steps";
    EXPECT_EQ(s.growth_tracker(), i);
  }
  s.update(false);  // the 5th
  EXPECT_EQ(s.scale(), 2048.0);
  EXPECT_EQ(s.growth_tracker(), 0);

  // Three finite steps, then an overflow: the count starts over, so four more are not enough.
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.growth_tracker(), 3);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  for (int i = 0; i < 4; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048.0);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(LossScalerClamp, GrowthStopsAtMaxScale) {
  DynamicLossScaler s({.init_scale = 4, .growth_interval = 1, .max_scale = 6});
  s.update(false);
  EXPECT_EQ(s.scale(), 6.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 6.0);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScalerClamp, BackoffStopsAtMinScaleAndAnOverflowThereThrows) {
  DynamicLossScaler s({.init_scale = 4, .min_scale = 3});
  s.update(true);
  EXPECT_EQ(s.scale(), 3.0);  // 4 * 0.5 = 2 clamped to 3
  EXPECT_EQ(s.skipped_steps(), 1);
  expect_error([&] { s.update(true); }, {"DynamicLossScaler::update", "minimum loss scale 3"});
  EXPECT_EQ(s.scale(), 3.0);  // unchanged by the failed update
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(false);  // finite steps still work there
  EXPECT_EQ(s.growth_tracker(), 1);
}

// ---- a simulated fp16 run --------------------------------------------------------------------------------

// What an fp16 backward seeded with `scale` would hand over: the true gradient times scale, rounded to f16.
Tensor fp16_backward(const std::vector<double>& true_grad, double scale) {
  std::vector<double> scaled(true_grad.size());
  for (std::size_t i = 0; i < true_grad.size(); ++i) scaled[i] = true_grad[i] * scale;
  return make(scaled, DType::f16);
}

TEST(LossScalerFp16, BacksOffUntilFiniteThenRecoversTheTrueGradient) {
  // A known f32 gradient with magnitudes in [1e-3, 8]: at the default 65536, 8 * 65536 overflows f16.
  std::vector<double> true_grad = random_values(21, 400, 1e-3, 8.0);
  for (double& g : true_grad) g = static_cast<float>(g);
  double largest = 0;
  for (double g : true_grad) largest = std::max(largest, std::abs(g));
  // f16 rounds to Inf from 65504 + half an ulp (16) up: count the halvings until the largest value fits.
  std::int64_t expected_skips = 0;
  for (double scale = 65536.0; largest * scale >= 65520.0; scale /= 2) ++expected_skips;
  ASSERT_GE(expected_skips, 3);

  DynamicLossScaler s({.growth_interval = 3});
  Tensor grad;
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 20) << "the scaler never found a finite step";
    grad = fp16_backward(true_grad, s.scale());
    const bool finite = s.unscale_({grad});
    s.update(!finite);
    if (finite) break;
  }
  EXPECT_EQ(s.skipped_steps(), expected_skips);
  EXPECT_EQ(s.scale(), 65536.0 / std::ldexp(1.0, static_cast<int>(expected_skips)));
  EXPECT_EQ(grad.dtype(), DType::f16);
  // The only error left is the f16 rounding of the scaled value (unscaling by a power of two is exact).
  memtrain::testing::expect_close(values_of(grad), true_grad, unit_roundoff(DType::f16), 0.0, "unscaled grad");

  // Two more finite steps reach the interval: the scale doubles, overflows again and backs off.
  const double settled = s.scale();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(s.unscale_({fp16_backward(true_grad, s.scale())}));
    s.update(false);
  }
  EXPECT_EQ(s.scale(), 2 * settled);
  EXPECT_FALSE(s.unscale_({fp16_backward(true_grad, s.scale())}));
  s.update(true);
  EXPECT_EQ(s.scale(), settled);
  EXPECT_EQ(s.skipped_steps(), expected_skips + 1);
}

// ---- unscale before clipping -----------------------------------------------------------------------------

TEST(LossScalerClip, UnscaleThenClipEqualsClippingTheTrueGradients) {
  const std::vector<std::vector<double>> true_grads = {random_values(31, 35, 0.1, 3.0),
                                                       random_values(32, 11, 0.1, 3.0)};
  auto make_params = [&](double scale) {
    std::vector<Tensor> params;
    for (const auto& g : true_grads) {
      std::vector<double> scaled(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) scaled[i] = static_cast<float>(g[i]) * scale;
      Tensor p = zeros({static_cast<std::int64_t>(g.size())});
      p.set_requires_grad(true);
      p.set_grad(make(scaled, DType::f32));
      params.push_back(p);
    }
    return params;
  };
  double norm = 0;
  for (const auto& g : true_grads)
    for (double x : g) norm += static_cast<double>(static_cast<float>(x)) * static_cast<float>(x);
  norm = std::sqrt(norm);
  const double max_norm = norm / 3;
  const double factor = max_norm / (norm + 1e-6);  // clip_grad_norm's documented rule

  const std::vector<Tensor> reference = make_params(1.0);
  train::clip_grad_norm(reference, max_norm);

  const double scale = 1024.0;
  const std::vector<Tensor> scaled = make_params(scale);
  DynamicLossScaler s({.init_scale = scale});
  std::vector<Tensor> grads;
  for (const auto& p : scaled) grads.push_back(p.grad());
  ASSERT_TRUE(s.unscale_(grads));
  EXPECT_NEAR(train::clip_grad_norm(scaled, max_norm), norm, 1e-6 * norm);  // the norm in true units

  for (std::size_t k = 0; k < true_grads.size(); ++k) {
    const std::vector<double> got = values_of(scaled[k].grad());
    EXPECT_EQ(got, values_of(reference[k].grad())) << "param " << k;
    std::vector<double> expected(true_grads[k].size());
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<float>(true_grads[k][i]) * factor;
    memtrain::testing::expect_close(got, expected, 1e-6, 0.0, "clipped grad");
  }

  // The wrong order: clipping the scaled gradients leaves a norm of max_norm / scale once unscaled.
  const std::vector<Tensor> wrong = make_params(scale);
  train::clip_grad_norm(wrong, max_norm);
  std::vector<Tensor> wrong_grads;
  for (const auto& p : wrong) wrong_grads.push_back(p.grad());
  DynamicLossScaler(LossScalerOptions{.init_scale = scale}).unscale_(wrong_grads);
  EXPECT_NEAR(train::global_grad_norm(wrong), max_norm / scale, 1e-5 * max_norm / scale);
}

// ---- state -----------------------------------------------------------------------------------------------

TEST(LossScalerState, SaveLoadRoundTripContinuesIdentically) {
  const LossScalerOptions opts{.init_scale = 1024, .growth_interval = 3};
  DynamicLossScaler a(opts);
  a.update(true);
  a.update(false);
  a.update(false);  // scale 512, tracker 2, one skipped
  optim::StateDict dict;
  dict.emplace("model.weight", zeros({2}));  // other entries of a shared dict are left alone
  a.save(dict, "scaler");
  ASSERT_EQ(dict.count("scaler.scale"), 1u);
  EXPECT_EQ(dict.at("scaler.scale").dtype(), DType::f64);
  EXPECT_EQ(dict.at("scaler.scale").dim(), 0);
  EXPECT_EQ(dict.at("scaler.growth_tracker").dtype(), DType::i64);
  EXPECT_EQ(dict.at("scaler.skipped_steps").dtype(), DType::i64);
  EXPECT_EQ(dict.at("scaler.scale").item(), 512.0);

  DynamicLossScaler b(opts);
  b.load(dict, "scaler");
  EXPECT_EQ(b.scale(), 512.0);
  EXPECT_EQ(b.growth_tracker(), 2);
  EXPECT_EQ(b.skipped_steps(), 1);
  for (bool found_inf : {false, false, true, false, false, false, false}) {
    a.update(found_inf);
    b.update(found_inf);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.growth_tracker(), b.growth_tracker());
    EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
  }
  // By hand: tracker 2 -> 3 grows 512 to 1024; the overflow backs off to 512; three finite steps grow it again.
  EXPECT_EQ(b.scale(), 1024.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.skipped_steps(), 2);
}

TEST(LossScalerState, LoadRejectsMissingMistypedOrOutOfRangeKeys) {
  DynamicLossScaler source({.init_scale = 1024, .growth_interval = 3});
  optim::StateDict good;
  source.save(good, "s");
  struct Case {
    std::string key;
    Tensor value;  // undefined: the key is removed
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"s.scale", Tensor(), "missing key 's.scale'"},
      {"s.growth_tracker", Tensor(), "missing key 's.growth_tracker'"},
      {"s.skipped_steps", Tensor(), "missing key 's.skipped_steps'"},
      {"s.scale", tensor<float>({1024.0f}, {}), "f32"},
      {"s.scale", tensor<double>({1024.0}, {1}), "[1]"},
      {"s.growth_tracker", tensor<std::int32_t>({0}, {}), "i32"},
      {"s.scale", tensor<double>({0.5}, {}), "min_scale"},
      {"s.scale", tensor<double>({kNaN}, {}), "min_scale"},
      {"s.scale", tensor<double>({1e30}, {}), "max_scale"},
      {"s.growth_tracker", tensor<std::int64_t>({3}, {}), "growth_interval = 3"},
      {"s.growth_tracker", tensor<std::int64_t>({-1}, {}), "growth_interval"},
      {"s.skipped_steps", tensor<std::int64_t>({-2}, {}), "negative"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key + " " + c.needle);
    optim::StateDict dict = good;
    if (c.value.defined()) dict.insert_or_assign(c.key, c.value);
    else dict.erase(c.key);
    DynamicLossScaler target({.init_scale = 4096, .growth_interval = 3});
    target.update(true);  // state to keep: 2048, one skipped
    expect_error([&] { target.load(dict, "s"); }, {"DynamicLossScaler::load", c.key, c.needle});
    EXPECT_EQ(target.scale(), 2048.0);
    EXPECT_EQ(target.skipped_steps(), 1);
  }
}

}  // namespace
}  // namespace memtrain::amp
