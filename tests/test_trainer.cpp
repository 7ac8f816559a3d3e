// Trainer and TrainerConfig: JSON round trip and refusals, the LR schedule against its closed form,
// clipping against a float64 reference, k x b accumulation == 1 x kb batch, resume == uninterrupted (bit
// for bit), checkpoint pruning / crash safety / shape checks, and fit()'s metrics and summary files.
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/linear.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/train/train.h"

#include "error_text.h"
#include "token_dataset.h"
#include "trainer_fixtures.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

namespace mt = memtrain;
namespace fs = std::filesystem;
using mt::Tensor;
using mt::train::Trainer;
using mt::train::TrainerConfig;
using nlohmann::json;

namespace {

// ---- fixtures: tiny datasets and models ----------------------------------------------------------------

using mt::test_support::RegressionDataset;
using mt::test_support::TokenDataset;

class TinyNet : public mt::nn::Module {
 public:
  TinyNet(std::int64_t in, std::int64_t hidden, std::int64_t out, double dropout = 0.0) : dropout_(dropout) {
    fc1_ = register_module("fc1", std::make_shared<mt::nn::Linear>(in, hidden, true, mt::DType::f32, 0.5));
    fc2_ = register_module("fc2", std::make_shared<mt::nn::Linear>(hidden, out, true, mt::DType::f32, 0.5));
  }
  Tensor forward(const Tensor& x) const {
    Tensor h = mt::ops::dropout(mt::ops::tanh(fc1_->forward(x)), dropout_, is_training());
    return fc2_->forward(h);
  }

 private:
  double dropout_;
  std::shared_ptr<mt::nn::Linear> fc1_, fc2_;
};

mt::train::LossFn mse_loss(const std::shared_ptr<TinyNet>& net) {
  return [net](const mt::data::Batch& b) {
    Tensor d = net->forward(b.inputs) - b.targets;
    return mt::ops::mean(d * d);
  };
}

mt::nn::GPTConfig tiny_gpt(double dropout) {
  mt::nn::GPTConfig c;
  c.vocab_size = 32;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = dropout;
  return c;
}

using mt::test_support::gpt_loss;

// A config for fast tests: no files, constant lr unless a test sets a schedule.
TrainerConfig base_config() { return mt::test_support::quiet_config(); }

// A fresh, empty directory under the temp dir, removed by the destructor.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / fmt::format("memtrain_{}_{}", name, ::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str(const std::string& leaf = "") const { return leaf.empty() ? path.string() : (path / leaf).string(); }
};

std::vector<float> values(const Tensor& t) {
  Tensor c = t.detach().to(mt::DType::f32).contiguous();  // exact for bf16
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

using mt::test_support::error_of;

// ---- TrainerConfig --------------------------------------------------------------------------------------

TEST(TrainerConfig, JsonRoundTripsEveryField) {
  TrainerConfig c;
  c.model = {.preset = "small", .seq_len = 128, .dropout = 0.1, .init_from = "gpt2.safetensors"};
  c.data.train = {"a.bin", "b.bin"};
  c.data.val = {"v.bin"};
  c.data.prefetch = 4;
  c.data.shuffle = false;
  c.data.drop_last = false;
  c.optimizer = mt::optim::Spec::adamw8bit({.lr = 3e-4, .weight_decay = 0.05, .beta1 = 0.8, .beta2 = 0.95,
                                            .eps = 1e-6, .block_size = 128, .min_8bit_size = 1000});
  c.schedule = {.warmup_steps = 7, .min_lr_ratio = 0.25, .decay = mt::train::LrDecay::constant};
  c.grad_clip = 0.5;
  c.micro_batch = 3;
  c.grad_accum = 5;
  c.max_steps = 77;
  c.eval_interval = 11;
  c.eval_batches = 2;
  c.log_interval = 3;
  c.checkpoint_interval = 9;
  c.checkpoint_dir = "ckpts";
  c.keep_checkpoints = 4;
  c.max_bad_steps = 6;
  c.seed = 18446744073709551557ull;  // needs all 64 bits
  c.memory_budget_bytes = std::size_t{123456789};
  c.metrics_path = "m.jsonl";
  c.summary_path = "s.json";
  c.activation_checkpointing = mt::ckpt::Policy::parse("budget:64MiB");
  c.galore_rank = 16;
  c.galore_update_gap = 50;
  c.galore_scale = 0.5;
  c.galore_proj_type = mt::optim::GaLoreProjType::reverse_std_side;
  c.galore_svd = mt::optim::GaLoreSvd::exact;
  c.precision = mt::amp::Precision::fp16;
  c.loss_scaler = {.init_scale = 512, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 7,
                   .min_scale = 2, .max_scale = 8192};
  c.fp8_scaling = mt::amp::Fp8ScalingKind::delayed;
  c.fp8_amax_history = 32;
  c.fp8_margin = 2;

  TempDir dir("config");
  c.save(dir.str("run.json"));
  const TrainerConfig r = TrainerConfig::load(dir.str("run.json"));
  EXPECT_EQ(r.to_json(), c.to_json());
  EXPECT_EQ(r.model.preset, "small");
  EXPECT_EQ(r.model.seq_len, 128);
  EXPECT_EQ(r.model.dropout, 0.1);
  EXPECT_EQ(r.model.init_from, "gpt2.safetensors");
  EXPECT_EQ(r.data.train, c.data.train);
  EXPECT_EQ(r.data.val, c.data.val);
  EXPECT_EQ(r.data.prefetch, 4);
  EXPECT_FALSE(r.data.shuffle);
  EXPECT_FALSE(r.data.drop_last);
  EXPECT_EQ(r.optimizer.kind, mt::optim::OptimizerKind::adamw8bit);
  EXPECT_EQ(r.optimizer.lr, 3e-4);
  EXPECT_EQ(r.optimizer.weight_decay, 0.05);
  EXPECT_EQ(r.optimizer.beta1, 0.8);
  EXPECT_EQ(r.optimizer.beta2, 0.95);
  EXPECT_EQ(r.optimizer.eps, 1e-6);
  EXPECT_EQ(r.optimizer.block_size, 128);
  EXPECT_EQ(r.optimizer.min_8bit_size, 1000);
  EXPECT_EQ(r.schedule.warmup_steps, 7);
  EXPECT_EQ(r.schedule.min_lr_ratio, 0.25);
  EXPECT_EQ(r.schedule.decay, mt::train::LrDecay::constant);
  EXPECT_EQ(r.grad_clip, 0.5);
  EXPECT_EQ(r.micro_batch, 3);
  EXPECT_EQ(r.grad_accum, 5);
  EXPECT_EQ(r.effective_batch(), 15);
  EXPECT_EQ(r.max_steps, 77);
  EXPECT_EQ(r.eval_interval, 11);
  EXPECT_EQ(r.eval_batches, 2);
  EXPECT_EQ(r.log_interval, 3);
  EXPECT_EQ(r.checkpoint_interval, 9);
  EXPECT_EQ(r.checkpoint_dir, "ckpts");
  EXPECT_EQ(r.keep_checkpoints, 4);
  EXPECT_EQ(r.max_bad_steps, 6);
  EXPECT_EQ(r.seed, 18446744073709551557ull);
  EXPECT_EQ(r.memory_budget_bytes, std::optional<std::size_t>(123456789));
  EXPECT_EQ(r.metrics_path, "m.jsonl");
  EXPECT_EQ(r.summary_path, "s.json");

  // Missing keys keep their defaults; null means no budget.
  const TrainerConfig d = TrainerConfig::from_json(json{{"max_steps", 5}, {"memory_budget_bytes", nullptr}});
  EXPECT_EQ(d.max_steps, 5);
  EXPECT_EQ(d.micro_batch, TrainerConfig{}.micro_batch);
  EXPECT_FALSE(d.memory_budget_bytes.has_value());
}

TEST(TrainerConfig, OptimizerSpecsRoundTripPerFamily) {
  using mt::optim::Spec;
  const std::vector<Spec> specs = {
      Spec::sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true}),
      Spec::adamw({.lr = 1e-3, .weight_decay = 0.1, .beta1 = 0.85, .beta2 = 0.98, .eps = 1e-7}),
      Spec::adamw8bit({.lr = 2e-3, .block_size = 64}),
      Spec::adamw({.lr = 1e-3, .eps = 1e-6, .eps_mode = mt::optim::AdamEpsMode::hf}),
      Spec::lion({.lr = 1e-4, .weight_decay = 0.2, .beta1 = 0.95, .beta2 = 0.98}),
      Spec::lion8bit({.lr = 3e-5, .min_8bit_size = 10}),
      Spec::adafactor({.lr = 0.02, .beta1 = 0.9, .decay_rate = -0.7, .eps1 = 1e-29, .clip_threshold = 2.0}),
  };
  for (const Spec& s : specs) {
    const Spec r = mt::optim::spec_from_json(mt::optim::spec_to_json(s));
    EXPECT_EQ(r.to_string(), s.to_string());
    EXPECT_EQ(r.kind, s.kind);
    EXPECT_EQ(r.lr, s.lr);
    EXPECT_EQ(r.weight_decay, s.weight_decay);
    EXPECT_EQ(r.beta1, s.beta1);
    EXPECT_EQ(r.beta2, s.beta2);
    EXPECT_EQ(r.eps, s.eps);
    EXPECT_EQ(r.nesterov, s.nesterov);
    EXPECT_EQ(r.block_size, s.block_size);
    EXPECT_EQ(r.min_8bit_size, s.min_8bit_size);
    EXPECT_EQ(r.decay_rate, s.decay_rate);
    EXPECT_EQ(r.eps1, s.eps1);
    EXPECT_EQ(r.clip_threshold, s.clip_threshold);
    EXPECT_EQ(r.eps_mode, s.eps_mode);
  }
  EXPECT_EQ(mt::optim::spec_to_json(specs[0])["momentum"], 0.9);  // SGD's beta1 is written as momentum
  const Spec named = mt::optim::spec_from_name("lion", 1e-4, 0.3);
  EXPECT_EQ(named.kind, mt::optim::OptimizerKind::lion);
  EXPECT_EQ(named.lr, 1e-4);
  EXPECT_EQ(named.weight_decay, 0.3);
  EXPECT_EQ(named.beta2, mt::optim::LionOptions{}.beta2);
  EXPECT_NE(error_of([] { mt::optim::spec_from_name("adam", 1, 0); }).find("adamw8bit"), std::string::npos);
}

TEST(TrainerConfig, UnknownKeysAndWrongTypesAreNamed) {
  auto msg = [](const json& j) { return error_of([&] { TrainerConfig::from_json(j); }); };
  EXPECT_NE(msg(json{{"max_step", 5}}).find("unknown key 'max_step'"), std::string::npos) << msg(json{{"max_step", 5}});
  EXPECT_NE(msg(json{{"schedule", {{"warmup", 5}}}}).find("'schedule.warmup'"), std::string::npos);
  EXPECT_NE(msg(json{{"model", {{"layers", 5}}}}).find("'model.layers'"), std::string::npos);
  EXPECT_NE(msg(json{{"data", {{"shufle", true}}}}).find("'data.shufle'"), std::string::npos);
  // An option the optimizer family does not have is as wrong as a typo.
  const std::string opt = msg(json{{"optimizer", {{"kind", "adamw"}, {"momentum", 0.9}}}});
  EXPECT_NE(opt.find("'optimizer.momentum'"), std::string::npos) << opt;
  EXPECT_NE(msg(json{{"optimizer", {{"kind", "adamax"}}}}).find("unknown optimizer 'adamax'"), std::string::npos);
  EXPECT_NE(msg(json{{"micro_batch", "8"}}).find("'micro_batch' must be an integer"), std::string::npos);
  EXPECT_NE(msg(json{{"micro_batch", 8.5}}).find("'micro_batch' must be an integer"), std::string::npos);
  EXPECT_NE(msg(json{{"grad_clip", true}}).find("'grad_clip' must be a number"), std::string::npos);
  EXPECT_NE(msg(json{{"seed", -1}}).find("'seed'"), std::string::npos);
  EXPECT_NE(msg(json::array()).find("must be a JSON object"), std::string::npos);

  TempDir dir("badjson");
  {
    std::ofstream(dir.str("bad.json")) << "{\"max_steps\": 5,";
  }
  const std::string parse = error_of([&] { TrainerConfig::load(dir.str("bad.json")); });
  EXPECT_NE(parse.find(dir.str("bad.json")), std::string::npos) << parse;
  {
    std::ofstream(dir.str("typo.json")) << "{\"max_stepz\": 5}";
  }
  const std::string typo = error_of([&] { TrainerConfig::load(dir.str("typo.json")); });
  EXPECT_NE(typo.find("typo.json"), std::string::npos) << typo;
  EXPECT_NE(typo.find("max_stepz"), std::string::npos) << typo;
}

TEST(TrainerConfig, ValidateRefusesWithTheReason) {
  EXPECT_NO_THROW(TrainerConfig{}.validate());
  struct Case {
    std::function<void(TrainerConfig&)> edit;
    std::vector<std::string> expect;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {[](TrainerConfig& c) { c.micro_batch = 0; }, {"micro_batch"}},
      {[](TrainerConfig& c) { c.grad_accum = 0; }, {"grad_accum"}},
      {[](TrainerConfig& c) { c.max_steps = 0; }, {"max_steps"}},
      {[](TrainerConfig& c) { c.world_size = 0; }, {"world_size", ">= 1"}},
      {[](TrainerConfig& c) { c.zero = 3; }, {"zero must be 0, 1 or 2"}},
      {[](TrainerConfig& c) { c.zero = 2; c.device = mt::Device::cuda(0); }, {"zero 2 on cuda:0", "zero 1 on GPUs"}},
      {[](TrainerConfig& c) { c.zero = 1; c.optimizer = mt::optim::Spec::adafactor(); c.galore_rank = 4; },
       {"'adafactor' under GaLore", "whole rows"}},
      {[](TrainerConfig& c) { c.zero = 1; c.optimizer = mt::optim::Spec::adafactor(); c.device = mt::Device::cuda(0); },
       {"'adafactor' on cuda:0", "CPU only"}},
      {[](TrainerConfig& c) { c.world_size = 2; c.grad_accum = 3; }, {"grad_accum 3", "power of two"}},
      {[](TrainerConfig& c) { c.world_size = 2; c.layerwise_update = true; c.galore_rank = 4; },
       {"layerwise_update with GaLore", "canonical tree"}},
      {[](TrainerConfig& c) { c.canonical_reduction = true; c.layerwise_update = true; c.galore_rank = 4; },
       {"layerwise_update with GaLore", "canonical tree"}},
      {[](TrainerConfig& c) { c.world_size = 2; c.layerwise_update = true; c.device = mt::Device::cuda(0); },
       {"layerwise_update with world_size 2 on cuda:0"}},
      {[](TrainerConfig& c) {
         c.world_size = 2; c.layerwise_update = true; c.zero = 1; c.optimizer = mt::optim::Spec::adafactor();
       },
       {"layerwise_update with optimizer 'adafactor' at zero 1"}},
      {[](TrainerConfig& c) { c.precision = mt::amp::Precision::fp8; c.fp8_amax_history = 0; }, {"fp8_amax_history"}},
      {[](TrainerConfig& c) { c.precision = mt::amp::Precision::fp8; c.fp8_margin = -1; }, {"fp8_margin"}},
      {[](TrainerConfig& c) { c.precision = mt::amp::Precision::fp16; c.loss_scaler.backoff_factor = 1.5; },
       {"loss_scaler", "backoff_factor"}},
      {[](TrainerConfig& c) { c.galore_rank = -1; }, {"galore_rank", ">= 0"}},
      {[](TrainerConfig& c) { c.galore_rank = 8; c.galore_update_gap = 0; }, {"galore_update_gap"}},
      {[](TrainerConfig& c) { c.galore_rank = 8; c.galore_scale = 0; }, {"galore_scale"}},
      {[](TrainerConfig& c) { c.checkpoint_interval = 10; }, {"checkpoint_interval", "checkpoint_dir"}},
      {[](TrainerConfig& c) { c.keep_checkpoints = 0; }, {"keep_checkpoints"}},
      {[](TrainerConfig& c) { c.max_bad_steps = -1; }, {"max_bad_steps"}},
      {[](TrainerConfig& c) { c.eval_batches = 0; }, {"eval_batches"}},
      {[](TrainerConfig& c) { c.eval_interval = -1; }, {"eval_interval"}},
      {[](TrainerConfig& c) { c.log_interval = 0; }, {"log_interval"}},
      {[](TrainerConfig& c) { c.schedule.warmup_steps = c.max_steps; }, {"schedule.warmup_steps"}},
      {[](TrainerConfig& c) { c.schedule.min_lr_ratio = 1.5; }, {"schedule.min_lr_ratio"}},
      {[](TrainerConfig& c) { c.schedule.min_lr_ratio = -0.1; }, {"schedule.min_lr_ratio"}},
      {[](TrainerConfig& c) { c.grad_clip = -1; }, {"grad_clip"}},
      {[](TrainerConfig& c) { c.model.dropout = 1.0; }, {"model.dropout"}},
      {[](TrainerConfig& c) { c.optimizer.lr = -1e-3; }, {"optimizer.lr"}},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    TrainerConfig c;
    cases[i].edit(c);
    const std::string msg = error_of([&] { c.validate(); });
    EXPECT_EQ(msg.rfind("TrainerConfig: ", 0), 0u) << "case " << i << ": " << msg;
    for (const auto& s : cases[i].expect) EXPECT_NE(msg.find(s), std::string::npos) << "case " << i << ": " << msg;
  }
}

// The typed settings are read from JSON by name; a bad name is refused naming the key and the value.
TEST(TrainerConfig, FromJsonRefusesBadNames) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> expect;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["precision"] = "fp8"; j["fp8_scaling"] = "perblock"; }, {"fp8_scaling", "perblock"}},
      {[](json& j) { j["precision"] = "fp64"; }, {"precision", "unknown precision 'fp64'"}},
      {[](json& j) { j["activation_checkpointing"] = "fulll"; },
       {"activation_checkpointing", "unknown checkpoint policy 'fulll'"}},
      {[](json& j) { j["activation_checkpointing"] = "every:0"; }, {"activation_checkpointing", "k >= 1"}},
      {[](json& j) { j["galore_rank"] = 8; j["galore_proj_type"] = "diagonal"; }, {"galore_proj_type", "diagonal"}},
      {[](json& j) { j["galore_rank"] = 8; j["galore_svd"] = "qr"; }, {"galore_svd", "qr"}},
      {[](json& j) { j["galore_rank"] = 8; j["galore_decay_order"] = "during"; }, {"galore_decay_order", "during"}},
      {[](json& j) { j["optimizer"]["eps_mode"] = "keras"; }, {"eps_mode 'keras'", "torch, hf"}},
      {[](json& j) { j["schedule"]["decay"] = "linear"; }, {"schedule.decay 'linear'"}},
      {[](json& j) { j["device"] = "gpu"; }, {"device 'gpu'"}},
      {[](json& j) { j["precision"] = 16; }, {"'precision' must be a string"}},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    json j = TrainerConfig{}.to_json();
    cases[i].edit(j);
    const std::string msg = error_of([&] { (void)TrainerConfig::from_json(j); });
    EXPECT_EQ(msg.rfind("TrainerConfig", 0), 0u) << "case " << i << ": " << msg;
    for (const std::string& want : cases[i].expect) EXPECT_NE(msg.find(want), std::string::npos) << i << ": " << msg;
  }
  // And every name the config writes reads back as the same value.
  TrainerConfig c;
  c.device = mt::Device::meta();
  c.precision = mt::amp::Precision::bf16;
  c.activation_checkpointing = mt::ckpt::Policy::every(2);
  c.galore_proj_type = mt::optim::GaLoreProjType::right;
  c.galore_decay_order = mt::optim::GaLoreDecayOrder::after;
  c.schedule.decay = mt::train::LrDecay::constant;
  const TrainerConfig r = TrainerConfig::from_json(c.to_json());
  EXPECT_EQ(r.galore_decay_order, mt::optim::GaLoreDecayOrder::after);
  EXPECT_EQ(r.device, mt::Device::meta());
  EXPECT_EQ(r.precision, mt::amp::Precision::bf16);
  EXPECT_EQ(r.activation_checkpointing, mt::ckpt::Policy::every(2));
  EXPECT_EQ(r.galore_proj_type, mt::optim::GaLoreProjType::right);
  EXPECT_EQ(r.schedule.decay, mt::train::LrDecay::constant);
}

// The Trainer sets the configured checkpoint policy on the model itself (the examples used to).
TEST(TrainerFit, AppliesTheConfiguredCheckpointPolicy) {
  mt::manual_seed(12);
  mt::nn::GPTConfig g = mt::nn::GPTConfig::preset("tiny");
  g.vocab_size = 64;
  g.block_size = 16;
  auto gpt = std::make_shared<mt::nn::GPT>(g);
  auto ds = std::make_shared<TokenDataset>(16, 16, 64);
  TrainerConfig c;
  c.max_steps = 2;
  c.micro_batch = 2;
  c.data.prefetch = 1;
  c.activation_checkpointing = mt::ckpt::Policy::selective();
  ASSERT_NE(gpt->checkpointing().policy(), c.activation_checkpointing);
  Trainer t(c, gpt, [gpt](const mt::data::Batch& b) { return gpt->loss(b.inputs, b.targets); }, ds);
  EXPECT_EQ(gpt->checkpointing().policy(), c.activation_checkpointing);
}

// ---- LR schedule and clipping ---------------------------------------------------------------------------

TEST(TrainerSchedule, WarmupThenCosineMatchesClosedForm) {
  const double peak = 6e-4;
  const std::int64_t W = 3, N = 10;
  mt::train::LrSchedule s{.warmup_steps = W, .min_lr_ratio = 0.1, .decay = mt::train::LrDecay::cosine};
  for (std::int64_t step = 0; step <= N + 2; ++step) {
    double expect;
    if (step < W) {
      expect = peak * (step + 1) / 3.0;
    } else if (step >= N) {
      expect = 0.1 * peak;
    } else {
      const double t = (step - 3) / 7.0;
      expect = 0.1 * peak + 0.9 * peak * 0.5 * (1 + std::cos(std::numbers::pi * t));
    }
    EXPECT_NEAR(s.lr_at(step, peak, N), expect, 1e-15) << "step " << step;
  }
  EXPECT_DOUBLE_EQ(s.lr_at(W, peak, N), peak);       // the peak right after warmup
  EXPECT_DOUBLE_EQ(s.lr_at(0, peak, N), peak / 3);   // step 0 trains already
  mt::train::LrSchedule c{.warmup_steps = 2, .min_lr_ratio = 0.1, .decay = mt::train::LrDecay::constant};
  EXPECT_DOUBLE_EQ(c.lr_at(0, 1.0, 10), 0.5);
  EXPECT_DOUBLE_EQ(c.lr_at(9, 1.0, 10), 1.0);
  mt::train::LrSchedule none{.warmup_steps = 0, .min_lr_ratio = 0.0, .decay = mt::train::LrDecay::cosine};
  EXPECT_DOUBLE_EQ(none.lr_at(0, 2.0, 4), 2.0);
  EXPECT_NEAR(none.lr_at(2, 2.0, 4), 1.0, 1e-15);
}

TEST(TrainerSchedule, TrainerWritesTheScheduledLrIntoEveryGroup) {
  mt::manual_seed(1);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  TrainerConfig c = base_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  c.schedule = {.warmup_steps = 2, .min_lr_ratio = 0.2, .decay = mt::train::LrDecay::cosine};
  c.max_steps = 6;
  Trainer t(c, net, mse_loss(net), std::make_shared<RegressionDataset>(16, 4, 3));
  ASSERT_EQ(t.optimizer().param_groups().size(), 2u);  // weights (decay) and biases (no decay)
  for (std::int64_t step = 0; step < c.max_steps; ++step) {
    const double expect = c.schedule.lr_at(step, 1e-2, c.max_steps);
    const auto m = t.train_step();
    EXPECT_DOUBLE_EQ(m.lr, expect);
    for (const auto& g : t.optimizer().param_groups()) EXPECT_DOUBLE_EQ(g.lr, expect);
  }
}

TEST(TrainerClip, GlobalNormMatchesFloat64AndScales) {
  mt::manual_seed(3);
  std::vector<Tensor> params = {mt::randn({5, 7}), mt::randn({11}), mt::randn({2, 3, 4}), mt::randn({3})};
  for (auto& p : params) p.set_requires_grad(true);
  for (std::size_t i = 0; i + 1 < params.size(); ++i) params[i].set_grad(mt::randn(params[i].shape()) * 3.0);
  // params[3] has no gradient: it counts as zero.
  double ref = 0.0;
  std::vector<std::vector<float>> before;
  for (std::size_t i = 0; i + 1 < params.size(); ++i) {
    before.push_back(values(params[i].grad()));
    for (float g : before.back()) ref += static_cast<double>(g) * g;
  }
  ref = std::sqrt(ref);
  EXPECT_NEAR(mt::train::global_grad_norm(params), ref, 1e-12 * ref);

  // Above the threshold: every gradient scaled by max / (norm + 1e-6), the norm returned is the one before.
  const double max_norm = ref / 4;
  EXPECT_NEAR(mt::train::clip_grad_norm(params, max_norm), ref, 1e-12 * ref);
  const double scale = max_norm / (ref + 1e-6);
  for (std::size_t i = 0; i < before.size(); ++i) {
    const auto after = values(params[i].grad());
    for (std::size_t k = 0; k < after.size(); ++k)
      EXPECT_NEAR(after[k], before[i][k] * scale, 1e-6 * std::abs(before[i][k] * scale) + 1e-30);
  }
  EXPECT_NEAR(mt::train::global_grad_norm(params), max_norm, 1e-6 * max_norm);
  EXPECT_FALSE(params[3].grad().defined());

  // Below the threshold: untouched, bit for bit.
  const auto kept = values(params[0].grad());
  mt::train::clip_grad_norm(params, ref);
  EXPECT_EQ(values(params[0].grad()), kept);
}

// ---- accumulation ---------------------------------------------------------------------------------------

struct AccumCase {
  std::int64_t n, micro, accum;
};

// One step with (micro, accum) and one with (micro * accum, 1) over the same samples (no shuffle) from the
// same initial weights; returns the largest |difference| of the parameters after the step.
template <typename MakeModel, typename MakeLoss>
double accumulation_gap(const std::shared_ptr<mt::data::Dataset>& ds, AccumCase k, const mt::optim::Spec& spec,
                        MakeModel make_model, MakeLoss make_loss, double* loss_gap = nullptr) {
  TrainerConfig c = base_config();
  c.optimizer = spec;
  c.data.drop_last = false;
  c.max_steps = 1;
  std::vector<std::vector<float>> params[2];
  double losses[2];
  for (int run = 0; run < 2; ++run) {
    mt::manual_seed(11);
    auto model = make_model();
    c.micro_batch = run == 0 ? k.micro : k.micro * k.accum;
    c.grad_accum = run == 0 ? k.accum : 1;
    Trainer t(c, model, make_loss(model), ds);
    const auto m = t.train_step();
    EXPECT_EQ(m.samples, std::min(k.n, k.micro * k.accum));
    losses[run] = m.loss;
    for (auto& [name, p] : model->named_parameters()) params[run].push_back(values(p));
  }
  if (loss_gap) *loss_gap = std::abs(losses[0] - losses[1]);
  double gap = 0.0;
  for (std::size_t i = 0; i < params[0].size(); ++i)
    for (std::size_t j = 0; j < params[0][i].size(); ++j)
      gap = std::max(gap, static_cast<double>(std::abs(params[0][i][j] - params[1][i][j])));
  return gap;
}

// Tolerance: the two runs sum the same per-sample gradients in a different order and scale them by
// count_i / sum count (rounded to fp32) instead of 1 / count, so gradients agree to a few fp32 ulps
// (~1e-7 relative). SGD moves a parameter by lr * g (lr <= 0.5, |g| < 10: < 1e-6). AdamW's first step
// moves it by lr * g / (|g| + eps): insensitive to a relative error in g, but an absolute one (delta) is
// amplified up to lr * delta / (4 eps) where |g| ~ eps, so the GPT case, whose rarely seen embedding rows
// have gradients near 1e-8, uses eps 1e-6. 2e-6 is ~20 ulps of the weights.
constexpr double kAccumTol = 2e-6;

TEST(TrainerAccumulation, MicroBatchesEqualOneBatchMlp) {
  auto make = [] { return std::make_shared<TinyNet>(4, 8, 3); };
  const std::vector<mt::optim::Spec> specs = {mt::optim::Spec::sgd({.lr = 0.1}),
                                              mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1})};
  // Full micro-batches, and a dataset of 10 whose third micro-batch of 4 holds only 2 samples.
  for (AccumCase k : {AccumCase{12, 2, 3}, AccumCase{10, 4, 3}, AccumCase{7, 2, 4}}) {
    auto ds = std::make_shared<RegressionDataset>(k.n, 4, 3);
    for (const auto& spec : specs) {
      double loss_gap = 0;
      const double gap = accumulation_gap(ds, k, spec, make, mse_loss, &loss_gap);
      EXPECT_LT(gap, kAccumTol) << spec.to_string() << " n " << k.n << " micro " << k.micro << " accum " << k.accum;
      EXPECT_LT(loss_gap, 1e-6);
    }
  }
}

TEST(TrainerAccumulation, MicroBatchesEqualOneBatchGptPartial) {
  auto make = [] { return std::make_shared<mt::nn::GPT>(tiny_gpt(0.0)); };
  auto ds = std::make_shared<TokenDataset>(5, 8, 32);  // micro-batches of 2, 2, 1
  const auto adamw = mt::optim::Spec::adamw({.lr = 1e-2, .eps = 1e-6});
  const double gap = accumulation_gap(ds, AccumCase{5, 2, 3}, adamw, make, gpt_loss);
  EXPECT_LT(gap, kAccumTol);
  const double sgd = accumulation_gap(ds, AccumCase{5, 2, 3}, mt::optim::Spec::sgd({.lr = 0.5}), make, gpt_loss);
  EXPECT_LT(sgd, kAccumTol);
}

// A plain mean of micro-batch means would weigh the partial micro-batch's samples double: make sure the
// test above could see that, i.e. the accumulated loss is the mean over samples, not over micro-batches.
TEST(TrainerAccumulation, PartialMicroBatchIsWeightedByItsCount) {
  mt::manual_seed(5);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  auto ds = std::make_shared<RegressionDataset>(10, 4, 3);
  TrainerConfig c = base_config();
  c.data.drop_last = false;
  c.micro_batch = 4;
  c.grad_accum = 3;
  c.optimizer = mt::optim::Spec::sgd({.lr = 0.0});
  Trainer t(c, net, mse_loss(net), ds);
  double per_batch[3];
  double weighted = 0;
  {
    mt::autograd::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) {
      std::vector<std::int64_t> idx;
      for (int j = 4 * i; j < std::min(10, 4 * i + 4); ++j) idx.push_back(j);
      per_batch[i] = mse_loss(net)(ds->collate(idx)).item();
      weighted += per_batch[i] * static_cast<double>(idx.size()) / 10.0;
    }
  }
  const double naive = (per_batch[0] + per_batch[1] + per_batch[2]) / 3;
  ASSERT_GT(std::abs(naive - weighted), 1e-3);
  EXPECT_NEAR(t.train_step().loss, weighted, 1e-6);
}

// ---- checkpoints ----------------------------------------------------------------------------------------

TrainerConfig resume_config(const std::string& dir) {
  TrainerConfig c = base_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
  c.schedule = {.warmup_steps = 2, .min_lr_ratio = 0.1, .decay = mt::train::LrDecay::cosine};
  c.grad_clip = 0.5;
  c.data.shuffle = true;  // 10 samples, 4 per step: epochs end mid-step, permutations change per epoch
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.max_steps = 6;
  c.seed = 42;
  c.checkpoint_dir = dir;
  return c;
}

// Runs c.max_steps uninterrupted, then again stopped after 3 steps and resumed from the checkpoint file into
// a model with another init: losses and final parameters must be equal bit for bit.
void expect_resume_bit_identical(const TrainerConfig& c, const TempDir& dir) {
  auto ds = std::make_shared<TokenDataset>(10, 8, 32);
  const std::int64_t k = 3;

  // Uninterrupted.
  mt::manual_seed(7);
  auto a = std::make_shared<mt::nn::GPT>(tiny_gpt(0.2));  // dropout: the RNG stream must be restored
  std::vector<double> losses_a;
  {
    Trainer t(c, a, gpt_loss(a), ds);
    for (std::int64_t s = 0; s < c.max_steps; ++s) losses_a.push_back(t.train_step().loss);
  }

  // Stopped after k steps.
  mt::manual_seed(7);
  auto b = std::make_shared<mt::nn::GPT>(tiny_gpt(0.2));
  std::string path;
  {
    Trainer t(c, b, gpt_loss(b), ds);
    for (std::int64_t s = 0; s < k; ++s) EXPECT_EQ(t.train_step().loss, losses_a[s]);
    path = t.save_checkpoint();
    EXPECT_EQ(path, dir.str(mt::train::checkpoint_filename(k)));
    EXPECT_EQ(fs::path(path).filename(), "ckpt_00000003.safetensors");
    mt::randn({1000});  // move the RNG on: the checkpoint must bring it back
  }

  // A fresh model with another init resumes from the file.
  mt::manual_seed(12345);
  auto r = std::make_shared<mt::nn::GPT>(tiny_gpt(0.2));
  Trainer t(c, r, gpt_loss(r), ds);
  ASSERT_TRUE(t.resume_latest());
  EXPECT_EQ(t.step(), k);
  std::vector<double> losses_r;
  for (std::int64_t s = k; s < c.max_steps; ++s) losses_r.push_back(t.train_step().loss);
  for (std::int64_t s = k; s < c.max_steps; ++s) EXPECT_EQ(losses_r[s - k], losses_a[s]) << "step " << s + 1;
  const auto pa = a->named_parameters();
  const auto pr = r->named_parameters();
  ASSERT_EQ(pa.size(), pr.size());
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(values(pa[i].second), values(pr[i].second)) << pa[i].first;
}

TEST(TrainerCheckpoint, ResumedRunEqualsUninterruptedBitForBit) {
  TempDir dir("resume");
  expect_resume_bit_identical(resume_config(dir.str()), dir);
}

// Parameters stored in bf16 (no f32 master): the rounding's stream follows each parameter's saved step count,
// and Kahan's compensation is saved with the optimizer state, so a resumed run continues bit for bit.
// With GaLore stepping layer-wise (its own path, keyed by its own step counts) too.
TEST(TrainerCheckpoint, Bf16ParametersResumeBitForBit) {
  for (const auto params : {mt::amp::ParamDtype::bf16, mt::amp::ParamDtype::bf16_kahan}) {
    for (const bool galore : {false, true}) {
      SCOPED_TRACE(mt::amp::param_dtype_name(params) + (galore ? " + layer-wise GaLore" : ""));
      TempDir dir("resume_bf16");
      TrainerConfig c = resume_config(dir.str());
      c.precision = mt::amp::Precision::bf16;
      c.param_dtype = params;
      if (galore) {
        c.galore_rank = 4;
        c.galore_update_gap = 2;
        c.layerwise_update = true;
      }
      expect_resume_bit_identical(c, dir);
    }
  }
}

// GaLore from the config: the attention and MLP weights step in the projected space (with a refresh between
// the checkpoint and the end), the state is smaller than AdamW's, and a resumed run continues bit for bit.
TEST(TrainerGaLore, ProjectsTheBlockWeightsAndResumesBitForBit) {
  TempDir dir("galore");
  TrainerConfig c = resume_config(dir.str());
  c.galore_rank = 4;
  c.galore_update_gap = 2;
  expect_resume_bit_identical(c, dir);

  auto gpt = std::make_shared<mt::nn::GPT>(tiny_gpt(0.0));
  auto ds = std::make_shared<TokenDataset>(10, 8, 32);
  Trainer galore(c, gpt, gpt_loss(gpt), ds);
  galore.train_step();
  EXPECT_EQ(galore.optimizer().name(), "galore-adamw");
  c.galore_rank = 0;
  Trainer plain(c, gpt, gpt_loss(gpt), ds);
  plain.train_step();
  // c_attn (48 x 16), attn c_proj (16 x 16), c_fc (64 x 16), mlp c_proj (16 x 64) project to rank 4 on their
  // 16-wide side: state 2*4*r*max(m,n) plus the 4*16*r basis, against AdamW's 2*4*m*n.
  std::size_t saved = 0;
  for (const auto& [m, n] : std::vector<std::pair<std::size_t, std::size_t>>{{48, 16}, {16, 16}, {64, 16}, {16, 64}}) {
    saved += 8 * m * n - (8 * 4 * std::max(m, n) + 4 * 16 * 4);
  }
  EXPECT_EQ(plain.optimizer().state_bytes() - galore.optimizer().state_bytes(), saved);
}

TEST(TrainerCheckpoint, FileHoldsModelOptimizerAndMetadata) {
  TempDir dir("ckptfile");
  mt::manual_seed(2);
  auto net = std::make_shared<TinyNet>(4, 8, 3, 0.1);
  TrainerConfig c = base_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2});
  c.data.shuffle = true;
  Trainer t(c, net, mse_loss(net), std::make_shared<RegressionDataset>(10, 4, 3));
  t.train_step();
  t.train_step();
  const std::string path = dir.str("x.safetensors");
  t.save_checkpoint(path);
  const auto meta = mt::io::load_safetensors_metadata(path);
  EXPECT_EQ(meta.at("format"), "memtrain-checkpoint");
  EXPECT_EQ(meta.at("format_version"), "1");
  EXPECT_EQ(meta.at("step"), "2");
  EXPECT_EQ(meta.at("rng_seed"), std::to_string(mt::get_rng_state().seed));
  EXPECT_EQ(meta.at("rng_offset"), std::to_string(mt::get_rng_state().offset));
  EXPECT_EQ(meta.at("loader_epoch"), "0");
  EXPECT_EQ(meta.at("loader_batch"), "2");  // 2 micro-batches of 2 handed out
  EXPECT_EQ(meta.at("optimizer"), "AdamW");  // the optimizer's own name
  EXPECT_EQ(TrainerConfig::from_json(json::parse(meta.at("config"))).to_json(), c.to_json());
  const auto tensors = mt::io::load_safetensors(path);
  for (const auto& [name, p] : net->named_parameters()) {
    ASSERT_TRUE(tensors.count("model." + name)) << name;
    EXPECT_EQ(values(tensors.at("model." + name)), values(p));
  }
  for (const auto& [key, s] : t.optimizer().state_dict()) EXPECT_TRUE(tensors.count("optim." + key)) << key;
  EXPECT_EQ(tensors.size(), net->state_dict().size() + t.optimizer().state_dict().size());
}

TEST(TrainerCheckpoint, KeepsNewestAndSurvivesAFailedWrite) {
  TempDir dir("prune");
  mt::manual_seed(4);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  TrainerConfig c = base_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2});
  c.max_steps = 6;
  c.checkpoint_interval = 1;
  c.keep_checkpoints = 2;
  c.checkpoint_dir = dir.str();
  // The step-6 write cannot land: a directory holds its name, so the rename fails after the data is written.
  fs::create_directories(dir.str("ckpt_00000006.safetensors"));
  // Leftover temp file of a write that crashed (its pid cannot exist): never a checkpoint, and removed by the
  // next complete save. One of this very process is left alone: it may be a save in progress.
  { std::ofstream(dir.str("ckpt_00000009.safetensors.tmp.2147483647")) << "partial"; }
  const std::string ours = fmt::format("ckpt_00000008.safetensors.tmp.{}", ::getpid());
  { std::ofstream(dir.str(ours)) << "partial"; }
  {
    Trainer t(c, net, mse_loss(net), std::make_shared<RegressionDataset>(12, 4, 3));
    const std::string msg = error_of([&] { t.fit(); });
    EXPECT_NE(msg.find("ckpt_00000006.safetensors"), std::string::npos) << msg;
    EXPECT_EQ(t.step(), 6);
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // Steps 1..3 pruned after the writes of 4 and 5; no temp file of the failed write is left.
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt_00000004.safetensors", "ckpt_00000005.safetensors",
                                             "ckpt_00000006.safetensors", ours}));
  EXPECT_EQ(mt::train::latest_checkpoint(dir.str()), dir.str("ckpt_00000005.safetensors"));
  EXPECT_EQ(mt::train::latest_checkpoint(dir.str("missing")), "");

  auto fresh = std::make_shared<TinyNet>(4, 8, 3);
  Trainer t(c, fresh, mse_loss(fresh), std::make_shared<RegressionDataset>(12, 4, 3));
  ASSERT_TRUE(t.resume_latest());
  EXPECT_EQ(t.step(), 5);

  EXPECT_EQ(mt::train::prune_checkpoints(dir.str(), 1),
            std::vector<std::string>{dir.str("ckpt_00000004.safetensors")});
}

TEST(TrainerCheckpoint, LoadIntoAnotherShapeNamesFileAndTensor) {
  TempDir dir("shape");
  TrainerConfig c = base_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2});
  mt::manual_seed(6);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  const std::string path = dir.str("a.safetensors");
  {
    Trainer t(c, net, mse_loss(net), std::make_shared<RegressionDataset>(8, 4, 3));
    t.train_step();
    t.save_checkpoint(path);
  }
  auto wide = std::make_shared<TinyNet>(4, 8, 5);
  Trainer t(c, wide, mse_loss(wide), std::make_shared<RegressionDataset>(8, 4, 5));
  const auto before = values(wide->named_parameters()[0].second);
  const std::string msg = error_of([&] { t.load_checkpoint(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.fc2.bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5]"), std::string::npos) << msg;
  EXPECT_EQ(values(wide->named_parameters()[0].second), before);  // nothing was loaded
  EXPECT_EQ(t.step(), 0);

  // Another optimizer's state is refused too.
  TrainerConfig s = c;
  s.optimizer = mt::optim::Spec::sgd({.lr = 0.1, .momentum = 0.9});
  auto same = std::make_shared<TinyNet>(4, 8, 3);
  Trainer u(s, same, mse_loss(same), std::make_shared<RegressionDataset>(8, 4, 3));
  const std::string opt = error_of([&] { u.load_checkpoint(path); });
  EXPECT_NE(opt.find("'AdamW'"), std::string::npos) << opt;

  // A file written before checkpoints named the optimizer itself carries the config's kind: it still loads.
  auto meta = mt::io::load_safetensors_metadata(path);
  meta["optimizer"] = "adamw";
  const std::string legacy = dir.str("legacy.safetensors");
  mt::io::save_safetensors(legacy, mt::io::load_safetensors(path), meta);
  auto again = std::make_shared<TinyNet>(4, 8, 3);
  Trainer v(c, again, mse_loss(again), std::make_shared<RegressionDataset>(8, 4, 3));
  v.load_checkpoint(legacy);
  EXPECT_EQ(v.step(), 1);
  EXPECT_NE(error_of([&] { u.load_checkpoint(legacy); }).find("'adamw'"), std::string::npos);
}

// ---- fit(): metrics, summary, eval, budget ----------------------------------------------------------------

TEST(TrainerFit, WritesMetricsJsonlAndSummary) {
  TempDir dir("fit");
  mt::manual_seed(8);
  auto net = std::make_shared<TinyNet>(4, 16, 3);
  TrainerConfig c = base_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2});
  c.max_steps = 5;
  c.eval_interval = 2;
  c.eval_batches = 2;
  c.metrics_path = dir.str("metrics.jsonl");
  c.summary_path = dir.str("summary.json");
  auto val = std::make_shared<RegressionDataset>(5, 4, 3);
  Trainer t(c, net, mse_loss(net), std::make_shared<RegressionDataset>(20, 4, 3), val);
  std::int64_t callbacks = 0;
  t.on_step = [&](const mt::train::StepMetrics& m) { EXPECT_EQ(m.step, ++callbacks); };
  const auto summary = t.fit();
  EXPECT_EQ(callbacks, 5);

  std::ifstream in(c.metrics_path);
  std::string line;
  std::int64_t n = 0;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    ++n;
    EXPECT_EQ(j.at("step"), n);
    for (const char* key : {"loss", "lr", "grad_norm", "tokens", "samples", "step_seconds", "tokens_per_s",
                            "peak_bytes"})
      EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j.at("tokens"), 2 * 3);  // micro_batch 2, 3 outputs each
    EXPECT_GT(j.at("peak_bytes").get<double>(), 0);
    EXPECT_EQ(j.contains("val_loss"), n == 2 || n == 4 || n == 5) << line;  // every 2 steps and at the end
  }
  EXPECT_EQ(n, c.max_steps);

  // evaluate(): mean over the first min(eval_batches, one pass) val batches = samples 0..3 of 5.
  double expect_val = 0;
  {
    mt::autograd::NoGradGuard no_grad;
    net->eval();
    expect_val = mse_loss(net)(val->collate({0, 1, 2, 3})).item();
    net->train();
  }
  ASSERT_TRUE(summary.final_val_loss.has_value());
  EXPECT_NEAR(*summary.final_val_loss, expect_val, 1e-6);
  EXPECT_NEAR(t.evaluate(), expect_val, 1e-6);
  EXPECT_TRUE(net->is_training());

  std::ifstream sin(c.summary_path);
  const json s = json::parse(sin);
  for (const char* key : {"config", "steps", "final_train_loss", "final_val_loss", "tokens_per_second",
                          "median_step_seconds", "peak_bytes_by_category", "peak_bytes_total",
                          "optimizer_state_bytes", "peak_rss_bytes"})
    EXPECT_TRUE(s.contains(key)) << key;
  EXPECT_EQ(TrainerConfig::from_json(s.at("config")).to_json(), c.to_json());
  EXPECT_EQ(s.at("steps"), 5);
  EXPECT_EQ(s.at("final_train_loss").get<double>(), t.history().back().loss);
  std::size_t param_bytes = 0;
  for (const auto& [name, p] : net->named_parameters()) param_bytes += p.nbytes();
  EXPECT_GE(s.at("peak_bytes_total").get<std::size_t>(), param_bytes);
  EXPECT_GE(s.at("peak_bytes_by_category").at("parameters").get<std::size_t>(), param_bytes);
  std::size_t sum_at_peak = 0;
  for (const auto& [k, v] : s.at("peak_bytes_by_category").items()) sum_at_peak += v.get<std::size_t>();
  EXPECT_EQ(sum_at_peak, s.at("peak_bytes_total").get<std::size_t>());
  // AdamW: two fp32 moments per parameter (plus nothing else counted as state).
  EXPECT_EQ(s.at("optimizer_state_bytes").get<std::size_t>(), t.optimizer().state_bytes());
  EXPECT_GE(t.optimizer().state_bytes(), 2 * param_bytes);
  EXPECT_GT(s.at("peak_rss_bytes").get<std::size_t>(), std::size_t{1} << 20);
  EXPECT_GT(s.at("tokens_per_second").get<double>(), 0);
  // 3 targets per sample: samples/s is a third of tokens/s.
  EXPECT_NEAR(s.at("samples_per_second").get<double>() * 3, s.at("tokens_per_second").get<double>(),
              1e-9 * s.at("tokens_per_second").get<double>());
  EXPECT_GT(s.at("median_step_seconds").get<double>(), 0);
  EXPECT_LT(s.at("median_step_seconds").get<double>(), 1.0);
  // The last evaluation: eval_batches 2 of micro_batch 2 = samples 0..3, 3 targets each.
  EXPECT_EQ(s.at("val_batches"), 2);
  EXPECT_EQ(s.at("val_samples"), 4);
  EXPECT_EQ(s.at("val_tokens"), 12);
}

// A val set of fewer batches than eval_batches is evaluated once, no sample counted twice; an evaluation
// alone gets a summary saying what it covered.
TEST(TrainerFit, EvaluatesASmallValSetOnceAndSummarizesIt) {
  TempDir dir("eval_small");
  mt::manual_seed(11);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  TrainerConfig c = base_config();
  c.eval_batches = 8;
  c.summary_path = dir.str("eval.json");
  auto val = std::make_shared<RegressionDataset>(3, 4, 3);  // 2 batches of micro_batch 2: {0, 1} and {2}
  Trainer t(c, net, mse_loss(net), std::make_shared<RegressionDataset>(8, 4, 3), val);
  double expect = 0;
  {
    mt::autograd::NoGradGuard no_grad;
    net->eval();
    expect = mse_loss(net)(val->collate({0, 1, 2})).item();
    net->train();
  }
  EXPECT_FALSE(t.last_eval().has_value());
  const auto summary = t.evaluate_and_summarize();
  ASSERT_TRUE(t.last_eval().has_value());
  EXPECT_NEAR(t.last_eval()->loss, expect, 1e-6);
  EXPECT_EQ(t.last_eval()->batches, 2);
  EXPECT_EQ(t.last_eval()->samples, 3);
  EXPECT_EQ(t.last_eval()->tokens, 9);
  ASSERT_TRUE(summary.final_val_loss.has_value());
  EXPECT_NEAR(*summary.final_val_loss, expect, 1e-6);

  std::ifstream in(c.summary_path);
  const json s = json::parse(in);
  EXPECT_EQ(s.at("steps"), 0);
  EXPECT_TRUE(s.at("final_train_loss").is_null());  // no step ran
  EXPECT_NEAR(s.at("final_val_loss").get<double>(), expect, 1e-6);
  EXPECT_EQ(s.at("val_batches"), 2);
  EXPECT_EQ(s.at("val_samples"), 3);
  EXPECT_EQ(s.at("val_tokens"), 9);
  EXPECT_GT(s.at("peak_bytes_total").get<std::size_t>(), 0u);
}

TEST(TrainerFit, SummaryCarriesAProgramsOwnMetrics) {
  mt::train::RunSummary summary;
  EXPECT_TRUE(summary.to_json().at("val_tokens").is_null());
  summary.metrics["test_accuracy"] = 0.75;
  EXPECT_EQ(summary.to_json().at("test_accuracy").get<double>(), 0.75);
  summary.metrics["steps"] = 1.0;  // would hide the field
  const std::string error = error_of([&] { summary.to_json(); });
  EXPECT_NE(error.find("'steps'"), std::string::npos) << error;
}

TEST(TrainerFit, ResumedFitAppendsMetrics) {
  TempDir dir("append");
  TrainerConfig c = base_config();
  c.optimizer = mt::optim::Spec::sgd({.lr = 0.05});
  c.max_steps = 3;
  c.checkpoint_interval = 2;
  c.checkpoint_dir = dir.str("ck");
  c.metrics_path = dir.str("m.jsonl");
  auto ds = std::make_shared<RegressionDataset>(8, 4, 3);
  mt::manual_seed(9);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  {
    Trainer t(c, net, mse_loss(net), ds);
    t.fit();
  }
  EXPECT_EQ(mt::train::latest_checkpoint(c.checkpoint_dir), dir.str("ck/ckpt_00000003.safetensors"));
  c.max_steps = 5;
  Trainer t(c, net, mse_loss(net), ds);
  fs::remove(dir.str("ck/ckpt_00000003.safetensors"));
  testing::internal::CaptureStderr();
  ASSERT_TRUE(t.resume_latest());  // step 2
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("warning"), std::string::npos);  // only max_steps changed
  {
    // Other batching: allowed, with a warning that the data order will not match the original run's.
    TrainerConfig other = c;
    other.micro_batch = 1;
    Trainer u(other, net, mse_loss(net), ds);
    testing::internal::CaptureStderr();
    u.resume_latest();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("micro_batch 2, this run uses 1"), std::string::npos) << err;
    // ... unless the saved position (epoch 0, batch 2) does not exist in an epoch of 2 batches of 4.
    other.micro_batch = 4;
    Trainer v(other, net, mse_loss(net), ds);
    const std::string msg = error_of([&] { v.resume_latest(); });
    EXPECT_NE(msg.find("ckpt_00000002.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("loader position (epoch 0, batch 2)"), std::string::npos) << msg;
    EXPECT_EQ(v.step(), 0);
  }
  const auto summary = t.fit();
  EXPECT_EQ(summary.steps, 3);
  std::ifstream in(c.metrics_path);
  std::vector<std::int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(json::parse(line).at("step"));
  EXPECT_EQ(steps, (std::vector<std::int64_t>{1, 2, 3, 3, 4, 5}));
}

TEST(TrainerFit, MemoryBudgetIsSetAndRestored) {
  mt::Allocator& a = mt::Allocator::get(mt::Device::cpu());
  const auto previous = a.budget();
  mt::manual_seed(10);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  TrainerConfig c = base_config();
  c.memory_budget_bytes = std::size_t{1} << 40;
  {
    Trainer t(c, net, mse_loss(net), std::make_shared<RegressionDataset>(8, 4, 3));
    EXPECT_EQ(a.budget(), c.memory_budget_bytes);
  }
  EXPECT_EQ(a.budget(), previous);
}

TEST(TrainerFit, ConstructorChecksItsInputs) {
  mt::manual_seed(10);
  auto net = std::make_shared<TinyNet>(4, 8, 3);
  auto ds = std::make_shared<RegressionDataset>(8, 4, 3);
  TrainerConfig bad = base_config();
  bad.activation_checkpointing = mt::ckpt::Policy::full();  // TinyNet has no checkpointable blocks
  EXPECT_NE(error_of([&] { Trainer t(bad, net, mse_loss(net), ds); }).find("activation checkpointing 'full'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Trainer t(base_config(), nullptr, mse_loss(net), ds); }).find("model is null"),
            std::string::npos);
  Trainer t(base_config(), net, mse_loss(net), ds);
  EXPECT_NE(error_of([&] { t.evaluate(); }).find("no validation dataset"), std::string::npos);
  EXPECT_NE(error_of([&] { t.save_checkpoint(); }).find("checkpoint_dir"), std::string::npos);
}

}  // namespace
