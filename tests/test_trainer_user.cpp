// The Trainer as a user with their own model meets it: GaLore targets chosen by name patterns (and the
// refusal that lists the 2-D parameters), an optimizer built by hand (schedule, clipping, layer-wise updates,
// bit-exact resume, refusals), autocast's promotion of a compute-dtype / f32 pair against a float64 reference,
// and a hand-written loop's forward counted as activations without a CategoryGuard.
#include "memtrain/amp/autocast.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/name_glob.h"
#include "memtrain/core/rng.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/linear.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/optim/galore.h"
#include "memtrain/train/train.h"

#include "error_text.h"
#include "temp_dir.h"
#include "trainer_fixtures.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::DType;
using mt::Tensor;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

// ---- fixtures ------------------------------------------------------------------------------------------

using mt::test_support::RegressionDataset;

// A 1-D gain, registered as "weight": a match of "*.weight" that GaLore must skip.
class Gain : public mt::nn::Module {
 public:
  explicit Gain(std::int64_t n) { weight = register_parameter("weight", mt::ones({n})); }
  Tensor weight;
};

// Names no default GaLore rule knows: "mixer.w_in.weight", "mixer.w_out.weight", "mixer.gain.weight", biases.
class Mixer : public mt::nn::Module {
 public:
  Mixer(std::int64_t d, std::int64_t h, std::int64_t o) {
    w_in_ = register_module("w_in", std::make_shared<mt::nn::Linear>(d, h, true, DType::f32, 0.5));
    gain_ = register_module("gain", std::make_shared<Gain>(h));
    w_out_ = register_module("w_out", std::make_shared<mt::nn::Linear>(h, o, true, DType::f32, 0.5));
  }
  Tensor forward(const Tensor& x) const { return w_out_->forward(mt::ops::tanh(w_in_->forward(x)) * gain_->weight); }

 private:
  std::shared_ptr<mt::nn::Linear> w_in_, w_out_;
  std::shared_ptr<Gain> gain_;
};

class UserNet : public mt::nn::Module {
 public:
  UserNet() { mixer = register_module("mixer", std::make_shared<Mixer>(kD, kH, kO)); }
  static constexpr std::int64_t kD = 6, kH = 8, kO = 3;
  std::shared_ptr<Mixer> mixer;
};

std::shared_ptr<UserNet> make_net(std::uint64_t seed = 7) {
  mt::manual_seed(seed);
  return std::make_shared<UserNet>();
}

mt::train::LossFn mse(const std::shared_ptr<UserNet>& net) {
  return [net](const mt::data::Batch& b) {
    Tensor d = net->mixer->forward(b.inputs) - b.targets;
    return mt::ops::mean(d * d);
  };
}

std::shared_ptr<RegressionDataset> data() { return std::make_shared<RegressionDataset>(12, UserNet::kD, UserNet::kO); }

TrainerConfig base_config() {
  TrainerConfig c = mt::test_support::quiet_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  return c;
}

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.detach().to(DType::f32).contiguous();
  return {c.data<float>(), c.data<float>() + c.numel()};
}

Tensor param(const std::shared_ptr<UserNet>& net, const std::string& name) {
  for (const auto& [n, p] : net->named_parameters())
    if (n == name) return p;
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

using mt::test_support::error_of;

// ---- GaLore targets ------------------------------------------------------------------------------------

TEST(TrainerUserGaLore, PatternSyntax) {
  const auto galore_pattern_matches = mt::name_glob_matches;
  EXPECT_TRUE(galore_pattern_matches("*.w_in.weight", "mixer.w_in.weight"));
  EXPECT_TRUE(galore_pattern_matches("mixer.*.weight", "mixer.w_in.weight"));
  EXPECT_TRUE(galore_pattern_matches("mixer.*", "mixer.a.b.c"));  // '*' crosses dots
  EXPECT_TRUE(galore_pattern_matches("*", "anything"));
  EXPECT_TRUE(galore_pattern_matches("mixer.w_in.weight", "mixer.w_in.weight"));
  EXPECT_TRUE(galore_pattern_matches("*a*a*", "banana"));
  EXPECT_FALSE(galore_pattern_matches("w_in.weight", "mixer.w_in.weight"));  // the whole name, not a part
  EXPECT_FALSE(galore_pattern_matches("*.w_in", "mixer.w_in.weight"));
  EXPECT_FALSE(galore_pattern_matches("*a*a*a*a", "banana"));
}

// "*.weight" picks the two renamed matrices and skips the 1-D gain it also matches; they step in the projected
// space (their state is GaLore's), and the run trains.
TEST(TrainerUserGaLore, TargetsSelectRenamedWeightsAndProjectThem) {
  auto net = make_net();
  TrainerConfig c = base_config();
  c.galore_rank = 2;
  c.galore_update_gap = 2;
  c.galore_targets = {"*.weight"};
  Trainer t(c, net, mse(net), data());
  auto* galore = dynamic_cast<mt::optim::GaLore*>(&t.optimizer());
  ASSERT_NE(galore, nullptr);
  EXPECT_TRUE(galore->is_projected(param(net, "mixer.w_in.weight")));
  EXPECT_TRUE(galore->is_projected(param(net, "mixer.w_out.weight")));
  EXPECT_FALSE(galore->is_projected(param(net, "mixer.gain.weight")));  // 1-D: skipped
  EXPECT_FALSE(galore->is_projected(param(net, "mixer.w_in.bias")));
  const std::vector<float> before = values(param(net, "mixer.w_in.weight"));
  for (int s = 0; s < 4; ++s) EXPECT_TRUE(std::isfinite(t.train_step().loss));
  EXPECT_NE(values(param(net, "mixer.w_in.weight")), before);
  // Projected parameters are numbered first: both carry a basis, and their AdamW moments have the projected
  // shape (rank 2 on one side), not the weight's.
  const mt::optim::StateDict sd = galore->state_dict();
  const mt::Shape shapes[] = {{8, 6}, {3, 8}};
  for (int i = 0; i < 2; ++i) {
    const std::string k = std::to_string(i);
    EXPECT_EQ(sd.count(k + ".galore.left") + sd.count(k + ".galore.right"), 1u) << i;
    ASSERT_EQ(sd.count(k + ".exp_avg"), 1u) << i;
    const mt::Shape m = sd.at(k + ".exp_avg").shape();
    EXPECT_NE(m, shapes[i]) << i;
    EXPECT_TRUE(m.size() == 2 && (m[0] == 2 || m[1] == 2)) << mt::shape_str(m);
  }
  EXPECT_EQ(sd.at("2.exp_avg").shape(), mt::Shape{8});  // a plain parameter keeps its own shape

  // One exact name selects one matrix.
  auto net2 = make_net();
  c.galore_targets = {"mixer.w_out.weight"};
  Trainer t2(c, net2, mse(net2), data());
  auto& g2 = dynamic_cast<mt::optim::GaLore&>(t2.optimizer());
  EXPECT_FALSE(g2.is_projected(param(net2, "mixer.w_in.weight")));
  EXPECT_TRUE(g2.is_projected(param(net2, "mixer.w_out.weight")));
}

// Patterns that match nothing, and the default rule on a model without attn/mlp modules, refuse and list the
// 2-D parameters with their shapes.
TEST(TrainerUserGaLore, NoMatchRefusesListingTheMatrices) {
  auto net = make_net();
  TrainerConfig c = base_config();
  c.galore_rank = 2;
  c.galore_targets = {"*.attn.*", "*.gain.weight"};  // the gain is 1-D: it matches, but is no matrix
  const std::string e = error_of([&] { Trainer t(c, net, mse(net), data()); });
  EXPECT_NE(e.find("*.attn.*, *.gain.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("match no 2-D parameter"), std::string::npos) << e;
  EXPECT_NE(e.find("mixer.w_in.weight [8, 6]"), std::string::npos) << e;
  EXPECT_NE(e.find("mixer.w_out.weight [3, 8]"), std::string::npos) << e;
  EXPECT_EQ(e.find("mixer.gain.weight"), std::string::npos) << e;

  c.galore_targets.clear();
  const std::string d = error_of([&] { Trainer t(c, net, mse(net), data()); });
  EXPECT_NE(d.find("galore_targets"), std::string::npos) << d;
  EXPECT_NE(d.find("mixer.w_in.weight [8, 6], mixer.w_out.weight [3, 8]"), std::string::npos) << d;

  // The list is capped.
  mt::nn::NamedTensors many;
  for (int i = 0; i < 20; ++i) many.emplace_back("m" + std::to_string(i), mt::zeros({2, 2}));
  const std::string list = mt::optim::describe_matrices(many, 3);
  EXPECT_EQ(list, "m0 [2, 2], m1 [2, 2], m2 [2, 2], and 17 more");
}

TEST(TrainerUserGaLore, TargetsRoundTripThroughJson) {
  TrainerConfig c = base_config();
  c.galore_rank = 4;
  c.galore_targets = {"*.w_in.weight", "mixer.*.weight"};
  const nlohmann::json j = c.to_json();
  ASSERT_TRUE(j.contains("galore_targets"));
  EXPECT_EQ(j["galore_targets"], nlohmann::json::array({"*.w_in.weight", "mixer.*.weight"}));
  const TrainerConfig r = TrainerConfig::from_json(j);
  EXPECT_EQ(r.galore_targets, c.galore_targets);
  EXPECT_EQ(r.to_json(), j);
  EXPECT_TRUE(TrainerConfig::from_json(base_config().to_json()).galore_targets.empty());

  c.galore_targets = {"*.w_in.weight", ""};
  const std::string e = error_of([&] { c.validate(); });
  EXPECT_NE(e.find("galore_targets[1] is empty"), std::string::npos) << e;
}

// ---- an optimizer built by the user --------------------------------------------------------------------

// What Trainer builds from base_config(), built by hand: the two runs must agree bit for bit.
std::unique_ptr<mt::optim::Optimizer> config_like_optimizer(const std::shared_ptr<UserNet>& net) {
  const mt::optim::Spec spec = base_config().optimizer;
  return spec.make(mt::optim::decay_groups(net->named_parameters(), spec.lr, spec.weight_decay));
}

// Two groups with their own lrs: the matrices at 2e-2, the rest at 5e-3 without decay.
std::unique_ptr<mt::optim::Optimizer> two_lr_optimizer(const std::shared_ptr<UserNet>& net) {
  mt::optim::ParamGroup matrices, rest;
  matrices.lr = 2e-2;
  matrices.weight_decay = 0.1;
  rest.lr = 5e-3;
  for (const auto& [name, p] : net->named_parameters()) (p.dim() == 2 ? matrices : rest).params.push_back(p);
  std::vector<mt::optim::ParamGroup> groups{matrices, rest};
  return mt::optim::Spec::adamw({.lr = 1.0, .weight_decay = 0.0}).make(std::move(groups));
}

TEST(TrainerUserOptimizer, EqualsTheConfigsOptimizerWithClippingAndSchedule) {
  TrainerConfig c = base_config();
  c.grad_clip = 0.05;  // small: clipping acts
  c.schedule = {.warmup_steps = 1, .min_lr_ratio = 0.1, .decay = mt::train::LrDecay::cosine};
  auto a = make_net();
  auto b = make_net();
  Trainer ta(c, a, mse(a), data());
  Trainer tb(c, b, config_like_optimizer(b), mse(b), data());
  for (int s = 0; s < 4; ++s) {
    const mt::train::StepMetrics ma = ta.train_step(), mb = tb.train_step();
    EXPECT_EQ(ma.loss, mb.loss) << s;
    EXPECT_EQ(ma.lr, mb.lr) << s;
    EXPECT_EQ(ma.grad_norm, mb.grad_norm) << s;
    EXPECT_GT(ma.grad_norm, c.grad_clip) << s;
  }
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(values(pa[i].second), values(pb[i].second)) << pa[i].first;
}

// The schedule scales each group's own lr: the ratio between the groups stays.
TEST(TrainerUserOptimizer, ScheduleScalesEachGroupsOwnLr) {
  TrainerConfig c = base_config();
  c.max_steps = 6;
  c.schedule = {.warmup_steps = 2, .min_lr_ratio = 0.1, .decay = mt::train::LrDecay::cosine};
  auto net = make_net();
  Trainer t(c, net, two_lr_optimizer(net), mse(net), data());
  for (std::int64_t s = 0; s < c.max_steps; ++s) {
    const double scale = c.schedule.lr_at(s, 1.0, c.max_steps);
    const mt::train::StepMetrics m = t.train_step();
    const auto& groups = t.optimizer().param_groups();
    EXPECT_DOUBLE_EQ(groups[0].lr, 2e-2 * scale) << s;
    EXPECT_DOUBLE_EQ(groups[1].lr, 5e-3 * scale) << s;
    EXPECT_DOUBLE_EQ(m.lr, 2e-2 * scale) << s;  // the first group's
  }
}

// Stopped, saved, and resumed into a fresh model with a fresh optimizer built the same way: bit for bit.
TEST(TrainerUserOptimizer, CheckpointResumesBitForBit) {
  mt::test_support::TempDir dir;
  TrainerConfig c = base_config();
  c.max_steps = 6;
  c.grad_clip = 0.5;
  c.data.shuffle = true;
  c.schedule = {.warmup_steps = 1, .min_lr_ratio = 0.1, .decay = mt::train::LrDecay::cosine};
  auto a = make_net();
  std::vector<double> losses;
  {
    Trainer t(c, a, two_lr_optimizer(a), mse(a), data());
    for (std::int64_t s = 0; s < c.max_steps; ++s) losses.push_back(t.train_step().loss);
  }
  const std::string path = dir.file("user.safetensors");
  {
    auto b = make_net();
    Trainer t(c, b, two_lr_optimizer(b), mse(b), data());
    for (int s = 0; s < 3; ++s) EXPECT_EQ(t.train_step().loss, losses[s]);
    t.save_checkpoint(path);
  }
  auto r = make_net(999);  // another init: everything must come from the file
  Trainer t(c, r, two_lr_optimizer(r), mse(r), data());
  t.load_checkpoint(path);
  EXPECT_EQ(t.step(), 3);
  for (std::int64_t s = 3; s < c.max_steps; ++s) EXPECT_EQ(t.train_step().loss, losses[s]) << s;
  const auto pa = a->named_parameters(), pr = r->named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(values(pa[i].second), values(pr[i].second)) << pa[i].first;
}

// The checkpoint names the optimizer that stepped (the user's, not the config's kind), so a trainer with
// another optimizer refuses it even though both configs name AdamW.
TEST(TrainerUserOptimizer, CheckpointNamesTheUsersOptimizer) {
  mt::test_support::TempDir dir;
  const TrainerConfig c = base_config();  // optimizer kind: adamw
  const std::string path = dir.file("lion.safetensors");
  {
    auto net = make_net();
    mt::optim::ParamGroup all;
    for (const auto& [name, p] : net->named_parameters()) all.params.push_back(p);
    Trainer t(c, net, mt::optim::Spec::lion({.lr = 1e-3}).make({all}), mse(net), data());
    t.train_step();
    t.save_checkpoint(path);
  }
  EXPECT_EQ(mt::io::load_safetensors_metadata(path).at("optimizer"), "Lion");
  auto net = make_net();
  Trainer t(c, net, config_like_optimizer(net), mse(net), data());
  const std::string e = error_of([&] { t.load_checkpoint(path); });
  EXPECT_NE(e.find("holds state of optimizer 'Lion' but this trainer uses 'AdamW'"), std::string::npos) << e;
}

// Layer-wise updates step the user's optimizer from the hooks: without clipping, the parameters equal the
// ordinary step's bit for bit.
TEST(TrainerUserOptimizer, LayerwiseUpdatesWork) {
  TrainerConfig c = base_config();
  auto a = make_net();
  auto b = make_net();
  Trainer ta(c, a, two_lr_optimizer(a), mse(a), data());
  c.layerwise_update = true;
  Trainer tb(c, b, two_lr_optimizer(b), mse(b), data());
  for (int s = 0; s < 4; ++s) EXPECT_EQ(ta.train_step().loss, tb.train_step().loss) << s;
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(values(pa[i].second), values(pb[i].second)) << pa[i].first;
}

TEST(TrainerUserOptimizer, RefusalsSayWhy) {
  const TrainerConfig c = base_config();
  auto net = make_net();
  auto other = make_net(3);
  // Another model's parameters.
  std::string e = error_of([&] { Trainer t(c, net, config_like_optimizer(other), mse(net), data()); });
  EXPECT_NE(e.find("is not a parameter of the model"), std::string::npos) << e;
  // A parameter that requires grad left out.
  e = error_of([&] {
    mt::optim::ParamGroup g;
    for (const auto& [name, p] : net->named_parameters())
      if (name != "mixer.gain.weight") g.params.push_back(p);
    Trainer t(c, net, mt::optim::Spec::adamw().make({g}), mse(net), data());
  });
  EXPECT_NE(e.find("'mixer.gain.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("requires grad but the optimizer does not hold it"), std::string::npos) << e;
  // GaLore asked by the config while the optimizer is given.
  TrainerConfig g = c;
  g.galore_rank = 2;
  e = error_of([&] { Trainer t(g, net, config_like_optimizer(net), mse(net), data()); });
  EXPECT_NE(e.find("galore_rank 2 with an optimizer given"), std::string::npos) << e;
  e = error_of([&] { Trainer t(c, net, std::unique_ptr<mt::optim::Optimizer>(), mse(net), data()); });
  EXPECT_NE(e.find("the optimizer is null"), std::string::npos) << e;
}

// A frozen parameter (requires_grad false) may stay out of the optimizer: it does not change.
TEST(TrainerUserOptimizer, FrozenParametersMayBeLeftOut) {
  auto net = make_net();
  Tensor gain = param(net, "mixer.gain.weight");
  gain.set_requires_grad(false);
  mt::optim::ParamGroup g;
  for (const auto& [name, p] : net->named_parameters())
    if (p.requires_grad()) g.params.push_back(p);
  Trainer t(base_config(), net, mt::optim::Spec::adamw({.lr = 1e-2}).make({g}), mse(net), data());
  const std::vector<float> before = values(gain);
  t.train_step();
  EXPECT_EQ(values(gain), before);
}

// ---- autocast: a compute-dtype tensor with an f32 one ----------------------------------------------------

// h [B, T, C] bf16 + pos [T, C] f32 parameter under bf16 autocast: bf16 result, pos's gradient in f32 through the
// cast (its bf16 copy made once, under compute_weights, and kept by the guard under keep_for_backward), equal to the float64 gradient within bf16 rounding.
TEST(TrainerUserAutocast, Bf16PlusF32ParameterPromotesToBf16) {
  constexpr std::int64_t B = 4, T = 3, C = 5;
  mt::manual_seed(11);
  Tensor h = mt::randn({B, T, C}).to(DType::bf16);
  h.set_requires_grad(true);
  Tensor pos = mt::randn({T, C});
  pos.set_requires_grad(true);
  const std::vector<float> hv = values(h), pv = values(pos);

  Tensor loss;
  {
    mt::amp::Autocast bf16(mt::amp::AutocastMode{DType::bf16, nullptr, mt::amp::WeightCasts::keep_for_backward});
    const std::size_t weights_before = mt::memory_stats()[mt::MemoryCategory::compute_weights].live_bytes;
    const Tensor y = h + pos;  // the residual stream plus a learned position table
    EXPECT_EQ(y.dtype(), DType::bf16);
    EXPECT_EQ(y.shape(), (mt::Shape{B, T, C}));
    EXPECT_EQ(mt::memory_stats()[mt::MemoryCategory::compute_weights].live_bytes - weights_before,
              static_cast<std::size_t>(T * C * 2));
    const Tensor z = pos * y;  // the cached copy again, the other operand order
    EXPECT_EQ(z.dtype(), DType::bf16);
    EXPECT_EQ(mt::memory_stats()[mt::MemoryCategory::compute_weights].live_bytes - weights_before,
              static_cast<std::size_t>(T * C * 2));
    EXPECT_EQ((y - pos).dtype(), DType::bf16);
    EXPECT_EQ((y / mt::ops::add(pos, 4.0)).dtype(), DType::bf16);
    loss = mt::ops::sum(z);  // sum_btc pos * (h + pos)
  }
  loss.backward();
  ASSERT_TRUE(pos.grad().defined());
  EXPECT_EQ(pos.grad().dtype(), DType::f32);
  EXPECT_EQ(h.grad().dtype(), DType::bf16);
  // d/dpos[t,c] = sum_b (h[b,t,c] + 2 pos[t,c]); d/dh = pos, in float64.
  const std::vector<float> gp = values(pos.grad()), gh = values(h.grad());
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      double want = 0.0;
      for (std::int64_t b = 0; b < B; ++b) want += static_cast<double>(hv[(b * T + t) * C + c]) + 2.0 * pv[t * C + c];
      // bf16 rounding of the copy, the products and the B-term sum: a few ulps of 2^-8 on |terms| <= ~4 each.
      EXPECT_NEAR(gp[t * C + c], want, 0.05 * (1.0 + std::abs(want))) << t << "," << c;
      for (std::int64_t b = 0; b < B; ++b)
        EXPECT_NEAR(gh[(b * T + t) * C + c], pv[t * C + c], 1e-2 * (1.0 + std::abs(pv[t * C + c])));
    }
  }
}

TEST(TrainerUserAutocast, MismatchOutsideAutocastNamesItAndTheFix) {
  const Tensor h = mt::zeros({2, 3, 4}, DType::bf16);
  const Tensor pos = mt::zeros({3, 4});
  std::string e = error_of([&] { (void)(h + pos); });
  EXPECT_NE(e.find("add: dtype mismatch: [2, 3, 4] bf16 vs [3, 4] f32"), std::string::npos) << e;
  EXPECT_NE(e.find("outside amp::Autocast mixed dtypes are not promoted"), std::string::npos) << e;
  EXPECT_NE(e.find(".to(DType::"), std::string::npos) << e;
  e = error_of([&] { (void)(pos * h); });
  EXPECT_NE(e.find("mul: dtype mismatch"), std::string::npos) << e;
  // Under autocast only the compute dtype with f32 is promoted.
  mt::amp::Autocast bf16(DType::bf16);
  e = error_of([&] { (void)(h + mt::zeros({3, 4}, DType::f64)); });
  EXPECT_NE(e.find("promotes only a pair of its compute dtype and f32"), std::string::npos) << e;
  e = error_of([&] { (void)(h - mt::zeros({3, 4}, DType::f16)); });
  EXPECT_NE(e.find("sub: dtype mismatch"), std::string::npos) << e;
}

// The Trainer's bf16 forward of a model adding an f32 parameter to a bf16 stream now runs.
class PositionNet : public mt::nn::Module {
 public:
  PositionNet() {
    in_ = register_module("w_in", std::make_shared<mt::nn::Linear>(UserNet::kD, UserNet::kH, true, DType::f32, 0.5));
    out_ = register_module("w_out", std::make_shared<mt::nn::Linear>(UserNet::kH, UserNet::kO, true, DType::f32, 0.5));
    pos_ = register_parameter("pos", mt::zeros({UserNet::kH}));
  }
  Tensor forward(const Tensor& x) const { return out_->forward(in_->forward(x) + pos_); }  // bf16 + f32

 private:
  std::shared_ptr<mt::nn::Linear> in_, out_;
  Tensor pos_;
};

TEST(TrainerUserAutocast, TrainerBf16RunWithAnF32Addend) {
  mt::manual_seed(5);
  auto net = std::make_shared<PositionNet>();
  TrainerConfig c = base_config();
  c.precision = mt::amp::Precision::bf16;
  Trainer t(c, net, [net](const mt::data::Batch& b) {
    Tensor d = net->forward(b.inputs) - b.targets;  // bf16 - f32 targets: promoted too
    return mt::ops::mean(d * d);
  }, data());
  const double first = t.train_step().loss;
  for (int s = 0; s < 3; ++s) t.train_step();
  EXPECT_LT(t.history().back().loss, first);
}

// ---- a hand-written loop's forward counts as activations -------------------------------------------------

struct Live {
  std::size_t activations, other, parameters;
};
Live live_now() {
  const mt::MemoryStats s = mt::memory_stats();
  return {s[mt::MemoryCategory::activations].live_bytes, s[mt::MemoryCategory::other].live_bytes,
          s[mt::MemoryCategory::parameters].live_bytes};
}

// With no CategoryGuard, what the forward keeps for backward is under activations, exactly as much as under
// the Trainer's CategoryGuard(activations), nothing of it under other, and the parameters are not moved
// (a transposed weight is a view of theirs). Backward frees it again.
TEST(TrainerUserCategories, HandLoopForwardCountsAsActivations) {
  auto net = make_net();
  const Tensor x = mt::randn({4, UserNet::kD});  // the user's own input: stays other
  const Tensor y = mt::randn({4, UserNet::kO});
  auto forward = [&] {
    Tensor d = net->mixer->forward(x) - y;
    return mt::ops::mean(d * d);
  };
  ASSERT_FALSE(mt::category_guard_active());

  Live before = live_now();
  std::size_t guarded = 0;
  {
    Tensor loss;
    {
      mt::CategoryGuard category(mt::MemoryCategory::activations);
      EXPECT_TRUE(mt::category_guard_active());
      loss = forward();
    }
    guarded = live_now().activations - before.activations;
    loss.backward();
  }
  ASSERT_GT(guarded, 0u);
  net->zero_grad();

  before = live_now();
  mt::Allocator::get(mt::Device::cpu()).reset_peak();
  Tensor loss = forward();
  const Live after = live_now();
  EXPECT_EQ(after.activations - before.activations, guarded);
  EXPECT_EQ(after.other, before.other);
  EXPECT_EQ(after.parameters, before.parameters);
  EXPECT_GE(mt::memory_stats()[mt::MemoryCategory::activations].peak_bytes, after.activations);
  loss.backward();
  loss = Tensor();
  EXPECT_EQ(live_now().activations, before.activations);
  net->zero_grad();

  // Outside grad mode nothing is recorded, and nothing moves.
  {
    mt::autograd::NoGradGuard no_grad;
    const Live b = live_now();
    const Tensor l = forward();
    EXPECT_EQ(live_now().activations, b.activations);
  }
  // A guard naming another category is respected.
  {
    mt::CategoryGuard category(mt::MemoryCategory::workspace);
    const Live b = live_now();
    const Tensor l = forward();
    EXPECT_EQ(live_now().activations, b.activations);
  }
}

}  // namespace
