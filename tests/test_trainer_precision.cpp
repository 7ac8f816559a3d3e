// TrainerConfig.precision: bf16, fp16 and fp8 (both scalings) train a GPT to within 2% of the fp32 loss without
// diverging; evaluation leaves fp8's delayed-scaling state as it was; fp16's
// loss scaler skips a step whose gradients overflow (nothing changes, the scale halves) and grows again after
// its interval; its state resumes from a checkpoint file bit for bit.
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/train/train.h"

#include "temp_dir.h"
#include "token_dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

namespace mt = memtrain;
using mt::Tensor;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

using mt::test_support::TokenDataset;

std::shared_ptr<mt::nn::GPT> make_gpt() {
  mt::manual_seed(7);
  mt::nn::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = 0.1;
  return std::make_shared<mt::nn::GPT>(c);
}

mt::train::LossFn gpt_loss(const std::shared_ptr<mt::nn::GPT>& gpt) {
  return [gpt](const mt::data::Batch& b) { return gpt->loss(b.inputs, b.targets); };
}

TrainerConfig config(const std::string& precision) {
  TrainerConfig c;
  c.precision = mt::amp::parse_precision(precision);
  c.data.prefetch = 1;
  c.schedule.decay = mt::train::LrDecay::constant;
  c.grad_clip = 1.0;
  c.micro_batch = 4;
  c.grad_accum = 2;
  c.max_steps = 60;
  c.eval_interval = 0;
  c.log_interval = 1000;
  c.optimizer = mt::optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
  return c;
}

std::vector<double> losses(Trainer& t, std::int64_t steps) {
  std::vector<double> out;
  for (std::int64_t s = 0; s < steps; ++s) out.push_back(t.train_step().loss);
  return out;
}

double mean_of_last(const std::vector<double>& v, std::size_t n) {
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

TEST(TrainerPrecision, Bf16Fp16AndFp8TrainWithinTwoPercentOfFp32) {
  auto ds = std::make_shared<TokenDataset>(64, 16, 64);
  auto ref_model = make_gpt();
  Trainer ref(config("fp32"), ref_model, gpt_loss(ref_model), ds);
  const std::vector<double> fp32 = losses(ref, 60);
  ASSERT_LT(mean_of_last(fp32, 10), 0.6 * fp32.front()) << "the fp32 run must learn for the comparison to mean much";
  for (const std::string run : {"bf16", "fp16", "fp8:blockwise", "fp8:delayed"}) {
    SCOPED_TRACE(run);
    const std::string p = run.substr(0, run.find(':'));
    TrainerConfig c = config(p);
    if (p == "fp8") c.fp8_scaling = mt::amp::fp8_scaling_from_name(run.substr(4));
    auto model = make_gpt();
    Trainer t(c, model, gpt_loss(model), ds);
    const std::vector<double> low = losses(t, 60);
    for (double l : low) ASSERT_TRUE(std::isfinite(l));
    EXPECT_NEAR(mean_of_last(low, 10), mean_of_last(fp32, 10), 0.02 * mean_of_last(fp32, 10));
    std::printf("%s: mean loss of the last 10 of 60 steps %.4f (fp32 %.4f, first step %.4f)\n", run.c_str(),
                mean_of_last(low, 10), mean_of_last(fp32, 10), fp32.front());
    // Master weights stay f32.
    for (const auto& [name, w] : model->named_parameters()) EXPECT_EQ(w.dtype(), mt::DType::f32) << name;
    EXPECT_EQ(t.fp8_state() != nullptr, p == "fp8");
    if (run == "fp8:delayed") EXPECT_EQ(t.fp8_state()->layers(), 2u * 4u) << "one meta per block linear";
    if (p == "fp16") {
      ASSERT_NE(t.loss_scaler(), nullptr);
      EXPECT_TRUE(t.history().back().loss_scale.has_value());
    } else {
      EXPECT_EQ(t.loss_scaler(), nullptr);
      EXPECT_FALSE(t.history().back().loss_scale.has_value());
    }
  }
}

std::vector<std::vector<float>> snapshot(mt::nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor c = p.detach().contiguous();
    out.emplace_back(c.data<float>(), c.data<float>() + c.numel());
  }
  return out;
}

TEST(TrainerPrecision, Fp16SkipsAnOverflowingStepAndBacksOff) {
  auto model = make_gpt();
  // Micro-batch 3 of the run (step 2's second micro-batch) has its loss multiplied by 1e30: its gradients
  // overflow f32 on the way back, as an fp16 overflow would.
  int call = 0;
  auto base = gpt_loss(model);
  mt::train::LossFn loss = [&](const mt::data::Batch& b) {
    const Tensor l = base(b);
    return ++call == 4 ? mt::ops::mul(l, 1e30) : l;
  };
  TrainerConfig c = config("fp16");
  c.loss_scaler.init_scale = 1024;
  c.loss_scaler.growth_interval = 3;
  Trainer t(c, model, loss, std::make_shared<TokenDataset>(64, 16, 64));
  t.train_step();
  EXPECT_FALSE(t.history().back().skipped);
  const auto before = snapshot(*model);
  const auto state_before = t.optimizer().state_dict();
  const auto m = t.train_step();
  EXPECT_TRUE(m.skipped);
  EXPECT_EQ(*m.loss_scale, 1024.0);
  EXPECT_EQ(t.loss_scaler()->scale(), 512.0);
  EXPECT_EQ(t.loss_scaler()->skipped_steps(), 1);
  EXPECT_EQ(snapshot(*model), before) << "a skipped step must not move any weight";
  const auto state_after = t.optimizer().state_dict();
  ASSERT_EQ(state_after.size(), state_before.size());
  for (const auto& [key, v] : state_before) {
    const Tensor a = v.contiguous(), b = state_after.at(key).contiguous();
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << key;
  }
  // Gradients were cleared: the next step starts clean and steps.
  t.train_step();
  EXPECT_FALSE(t.history().back().skipped);
  EXPECT_NE(snapshot(*model), before);
  // Growth after 3 finite steps in a row: steps 3, 4, 5.
  t.train_step();
  EXPECT_EQ(t.loss_scaler()->scale(), 512.0);
  t.train_step();
  EXPECT_EQ(t.loss_scaler()->scale(), 1024.0);
  EXPECT_EQ(t.history().back().to_json().at("skipped"), false);
}

// Weights after 4 fp8-delayed steps, evaluating after each one or not. Each run builds its model with the same
// seed and runs alone, so both draw the same dropout masks from the default RNG stream.
std::vector<std::vector<float>> fp8_delayed_run(bool evaluate) {
  auto ds = std::make_shared<TokenDataset>(64, 16, 64);
  TrainerConfig c = config("fp8");
  c.fp8_scaling = mt::amp::Fp8ScalingKind::delayed;
  c.eval_batches = 2;
  auto model = make_gpt();
  Trainer t(c, model, gpt_loss(model), ds, ds);
  for (int s = 0; s < 4; ++s) {
    t.train_step();
    if (evaluate) t.evaluate();
  }
  EXPECT_EQ(t.fp8_state()->layers(), 8u);
  return snapshot(*model);
}

TEST(TrainerPrecision, Fp8EvaluationLeavesTheDelayedScalesAlone) {
  // Evaluation records amaxes of its own batches; were they kept, the next steps' scales (and weights) would
  // differ from a run without evaluation.
  EXPECT_EQ(fp8_delayed_run(true), fp8_delayed_run(false));
}

TEST(TrainerPrecision, Fp8DelayedResumesWithItsAmaxHistories) {
  mt::test_support::TempDir dir;
  auto ds = std::make_shared<TokenDataset>(64, 16, 64);
  TrainerConfig c = config("fp8");
  c.fp8_scaling = mt::amp::Fp8ScalingKind::delayed;
  c.fp8_amax_history = 4;
  c.checkpoint_dir = dir.file("ck");
  c.grad_clip = 0.0;  // so any difference in the scales reaches the weights unclipped
  auto a = make_gpt();
  Trainer whole(c, a, gpt_loss(a), ds);
  losses(whole, 6);

  auto b = make_gpt();
  Trainer first(c, b, gpt_loss(b), ds);
  losses(first, 3);
  const std::string path = first.save_checkpoint();
  auto b2 = make_gpt();
  Trainer second(c, b2, gpt_loss(b2), ds);
  second.load_checkpoint(path);
  EXPECT_EQ(second.fp8_state()->layers(), 8u);
  losses(second, 3);
  EXPECT_EQ(snapshot(*b2), snapshot(*a)) << "the resumed run must quantize with the scales the whole run had";
}

TEST(TrainerPrecision, Fp16ResumesWithItsScalerState) {
  mt::test_support::TempDir dir;
  auto ds = std::make_shared<TokenDataset>(64, 16, 64);
  TrainerConfig c = config("fp16");
  c.loss_scaler.init_scale = 2048;
  c.loss_scaler.growth_interval = 4;
  c.checkpoint_dir = dir.file("ck");
  auto a = make_gpt();
  Trainer whole(c, a, gpt_loss(a), ds);
  losses(whole, 6);

  auto b = make_gpt();
  Trainer first(c, b, gpt_loss(b), ds);
  losses(first, 3);
  const std::string path = first.save_checkpoint();
  auto b2 = make_gpt();
  // A different initial scale: only the file can bring the scaler back to where the run was.
  TrainerConfig c2 = c;
  c2.loss_scaler.init_scale = 4;
  Trainer second(c2, b2, gpt_loss(b2), ds);
  second.load_checkpoint(path);
  EXPECT_EQ(second.loss_scaler()->scale(), first.loss_scaler()->scale());
  EXPECT_EQ(second.loss_scaler()->growth_tracker(), first.loss_scaler()->growth_tracker());
  losses(second, 3);
  EXPECT_EQ(snapshot(*b2), snapshot(*a));
  EXPECT_EQ(second.loss_scaler()->scale(), whole.loss_scaler()->scale());
}

}  // namespace
