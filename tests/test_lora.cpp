// LoRA (nn/lora.h) on the tiny GPT and LLaMA: which Linears the targets choose (PEFT's suffix rule, globs,
// the default of every Linear in the blocks) and the refusal that lists them; PEFT's names and init; the
// first loss equal to the base model's bit for bit; the adapter's gradients against float64 math; merge and
// unmerge exact; and the Trainer training only the adapters: no gradient or optimizer state for the frozen
// base, with every optimizer, layer-wise updates, checkpointing and accumulation.
#include "memtrain/amp/autocast.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/lora.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nf4.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/train/trainer.h"

#include "error_text.h"
#include "temp_dir.h"
#include "tiny_lm.h"
#include "token_dataset.h"
#include "trainer_fixtures.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::DType;
using mt::Tensor;
using mt::nn::LoraConfig;
using mt::train::TrainerConfig;
using mt::test_support::make_tiny_lm;

namespace {

std::vector<std::string> paths(const mt::nn::NamedLinears& layers) {
  std::vector<std::string> out;
  for (const auto& [path, layer] : layers) out.push_back(path);
  return out;
}

LoraConfig lora(std::int64_t rank, std::vector<std::string> targets = {}) {
  LoraConfig c;
  c.rank = rank;
  c.targets = std::move(targets);
  return c;
}

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.detach().to(DType::f32).contiguous();
  return {c.data<float>(), c.data<float>() + c.numel()};
}

std::map<std::string, std::vector<float>> snapshot(const mt::nn::Module& m) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = values(p);
  return out;
}

Tensor batch_ids(std::int64_t b, std::int64_t t, std::uint64_t salt) {
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < b * t; ++i)
    ids.push_back(static_cast<std::int64_t>((i * 7 + salt * 13 + (i * i) % 5) % mt::test_support::kTinyVocab));
  return mt::tensor(ids, {b, t});
}

float gpt_loss_value(mt::nn::GPT& gpt, bool bf16) {
  mt::autograd::NoGradGuard no_grad;
  const Tensor idx = batch_ids(2, mt::test_support::kTinyWindow, 1);
  const Tensor targets = batch_ids(2, mt::test_support::kTinyWindow, 2);
  if (!bf16) return gpt.loss(idx, targets).item<float>();
  mt::amp::Autocast autocast(DType::bf16);
  return gpt.loss(idx, targets).item<float>();
}

// ---- choosing the layers -------------------------------------------------------------------------------

TEST(Lora, DefaultTargetsAreEveryLinearInsideTheBlocks) {
  auto gpt = make_tiny_lm(false);
  EXPECT_EQ(paths(mt::nn::lora_targets(*gpt, lora(4))),
            (std::vector<std::string>{"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc", "h.0.mlp.c_proj",
                                      "h.1.attn.c_attn", "h.1.attn.c_proj", "h.1.mlp.c_fc", "h.1.mlp.c_proj"}));
  // LLaMA's separate head is no block's: left out unless named.
  auto llama = make_tiny_lm(true);
  const std::vector<std::string> chosen = paths(mt::nn::lora_targets(*llama, lora(4)));
  EXPECT_EQ(chosen.size(), 14u);  // q, k, v, o, gate, up, down in each of 2 layers
  for (const std::string& p : chosen) EXPECT_EQ(p.rfind("layers.", 0), 0u) << p;
  EXPECT_EQ(paths(mt::nn::lora_targets(*llama, lora(4, {"lm_head"}))), std::vector<std::string>{"lm_head"});
}

TEST(Lora, PatternsMatchAsPeftsTargetModulesOrAsGlobs) {
  auto gpt = make_tiny_lm(false);
  auto chosen = [&](std::vector<std::string> t) { return paths(mt::nn::lora_targets(*gpt, lora(4, std::move(t)))); };
  EXPECT_EQ(chosen({"c_proj"}), (std::vector<std::string>{"h.0.attn.c_proj", "h.0.mlp.c_proj", "h.1.attn.c_proj",
                                                          "h.1.mlp.c_proj"}));
  EXPECT_EQ(chosen({"attn.c_proj"}), (std::vector<std::string>{"h.0.attn.c_proj", "h.1.attn.c_proj"}));
  EXPECT_EQ(chosen({"h.1.attn.c_attn"}), std::vector<std::string>{"h.1.attn.c_attn"});
  EXPECT_EQ(chosen({"h.1.*"}), (std::vector<std::string>{"h.1.attn.c_attn", "h.1.attn.c_proj", "h.1.mlp.c_fc",
                                                         "h.1.mlp.c_proj"}));
  // Registration order, each layer once, however many patterns match it.
  EXPECT_EQ(chosen({"c_fc", "h.0.mlp.*"}),
            (std::vector<std::string>{"h.0.mlp.c_fc", "h.0.mlp.c_proj", "h.1.mlp.c_fc"}));
}

TEST(Lora, APatternMatchingNoLinearIsRefusedListingTheLinears) {
  auto gpt = make_tiny_lm(false);
  // A suffix counts only at a dot: "proj" is no component of "c_proj".
  for (const std::string bad : {"proj", "nope", "wte"}) {
    const std::string msg = mt::test_support::error_of([&] { (void)mt::nn::lora_targets(*gpt, lora(4, {"c_attn", bad})); });
    EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("h.0.attn.c_attn, h.0.attn.c_proj"), std::string::npos) << msg;
  }
  // Nothing is changed by a refused apply.
  const auto before = snapshot(*gpt);
  EXPECT_THROW(mt::nn::apply_lora(*gpt, lora(4, {"nope"})), mt::Error);
  for (const auto& [name, p] : gpt->named_parameters()) EXPECT_TRUE(p.requires_grad()) << name;
  EXPECT_EQ(snapshot(*gpt), before);
}

TEST(Lora, RefusesSettingsOutOfRange) {
  auto gpt = make_tiny_lm(false);
  LoraConfig c = lora(4);
  c.dropout = 1.0;
  EXPECT_NE(mt::test_support::error_of([&] { mt::nn::apply_lora(*gpt, c); }).find("dropout"), std::string::npos);
  c = lora(-1);
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("rank"), std::string::npos);
  c = lora(4);
  c.alpha = 0.0;
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("alpha"), std::string::npos);
  EXPECT_THROW(mt::nn::apply_lora(*gpt, lora(0)), mt::Error);  // off
  mt::nn::apply_lora(*gpt, lora(4, {"c_fc"}));
  EXPECT_NE(mt::test_support::error_of([&] { mt::nn::apply_lora(*gpt, lora(4, {"c_fc"})); }).find("already"),
            std::string::npos);
}

// ---- the adapted model ---------------------------------------------------------------------------------

TEST(Lora, AddsPeftNamedAdaptersAndFreezesEverythingElse) {
  auto gpt = make_tiny_lm(false);
  const auto adapted = mt::nn::apply_lora(*gpt, lora(4), DType::bf16);
  ASSERT_EQ(adapted.size(), 8u);
  std::set<std::string> trainable;
  for (const auto& [name, p] : gpt->named_parameters()) {
    if (p.requires_grad()) trainable.insert(name);
    EXPECT_TRUE(p.is_leaf()) << name;
  }
  std::set<std::string> expected;
  for (const auto& [path, layer] : adapted) {
    expected.insert(path + ".lora_A.weight");
    expected.insert(path + ".lora_B.weight");
    EXPECT_EQ(layer->lora_A()->weight().shape(), (mt::Shape{4, layer->in_features()})) << path;
    EXPECT_EQ(layer->lora_B()->weight().shape(), (mt::Shape{layer->out_features(), 4})) << path;
    // B starts at zero; A uniform within +-1/sqrt(in) (Kaiming-uniform with a = sqrt(5)), and not all zero.
    for (float v : values(layer->lora_B()->weight())) EXPECT_EQ(v, 0.0f);
    const double bound = 1.0 / std::sqrt(static_cast<double>(layer->in_features()));
    double spread = 0;
    for (float v : values(layer->lora_A()->weight())) {
      EXPECT_LE(std::abs(v), bound);
      spread = std::max(spread, static_cast<double>(std::abs(v)));
    }
    EXPECT_GT(spread, 0.5 * bound);
    // The frozen weight and bias are stored in the dtype asked for.
    EXPECT_EQ(layer->weight().dtype(), DType::bf16) << path;
    EXPECT_EQ(layer->bias().dtype(), DType::bf16) << path;
    EXPECT_FALSE(layer->weight().requires_grad()) << path;
  }
  EXPECT_EQ(trainable, expected);
  // Parameters that are not the adapted layers' keep their dtype.
  EXPECT_EQ(gpt->named_parameters().front().second.dtype(), DType::f32);  // wte
}

TEST(Lora, FreshAdaptersLeaveTheLossBitForBit) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast, base stored in bf16" : "fp32");
    mt::manual_seed(11);
    auto base = std::static_pointer_cast<mt::nn::GPT>(make_tiny_lm(false));
    mt::manual_seed(11);
    auto adapted = std::static_pointer_cast<mt::nn::GPT>(make_tiny_lm(false));
    LoraConfig c = lora(8);
    c.alpha = 16;
    mt::nn::apply_lora(*adapted, c, bf16 ? DType::bf16 : DType::f32);
    const float expected = gpt_loss_value(*base, bf16);
    const float got = gpt_loss_value(*adapted, bf16);
    EXPECT_TRUE(std::isfinite(expected));
    EXPECT_EQ(std::memcmp(&expected, &got, sizeof(float)), 0) << expected << " vs " << got;
  }
}

// y = x W^T + b + s (x A^T) B^T, L = sum(y * G): dA = s (G B)^T x, dB = s G^T (x A^T), in float64.
TEST(Lora, AdapterGradientsMatchFloat64Math) {
  constexpr std::int64_t N = 5, in = 7, out = 6, r = 3;
  mt::manual_seed(3);
  mt::nn::Linear layer(in, out, true, DType::f32, 0.3);
  LoraConfig c = lora(r);
  c.alpha = 6.0;
  c.rslora = true;
  const double s = 6.0 / std::sqrt(3.0);
  ASSERT_DOUBLE_EQ(c.scaling(), s);
  layer.add_lora({r, c.scaling(), 0.0}, DType::f32);
  {
    mt::autograd::NoGradGuard no_grad;
    Tensor b = layer.lora_B()->weight();
    b.copy_(mt::randn({out, r}));
  }
  const Tensor x = mt::randn({N, in});
  const Tensor g = mt::randn({N, out});
  mt::ops::sum(layer.forward(x) * g).backward();
  const auto X = values(x), G = values(g), A = values(layer.lora_A()->weight()), B = values(layer.lora_B()->weight());
  const auto dA = values(layer.lora_A()->weight().grad()), dB = values(layer.lora_B()->weight().grad());
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < in; ++j) {
      double want = 0;
      for (std::int64_t n = 0; n < N; ++n) {
        double gb = 0;  // (G B)[n, i]
        for (std::int64_t o = 0; o < out; ++o) gb += double(G[n * out + o]) * B[o * r + i];
        want += gb * X[n * in + j];
      }
      EXPECT_NEAR(dA[i * in + j], s * want, 1e-5 * (1 + std::abs(s * want))) << "dA " << i << "," << j;
    }
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < r; ++i) {
      double want = 0;
      for (std::int64_t n = 0; n < N; ++n) {
        double xa = 0;  // (x A^T)[n, i]
        for (std::int64_t j = 0; j < in; ++j) xa += double(X[n * in + j]) * A[i * in + j];
        want += double(G[n * out + o]) * xa;
      }
      EXPECT_NEAR(dB[o * r + i], s * want, 1e-5 * (1 + std::abs(s * want))) << "dB " << o << "," << i;
    }
  EXPECT_FALSE(layer.weight().grad().defined());
  EXPECT_FALSE(layer.bias().grad().defined());
}

TEST(Lora, MergeFoldsTheUpdateInAndUnmergeRestoresTheExactBits) {
  for (const DType base : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(mt::dtype_name(base));
    constexpr std::int64_t in = 16, out = 12, r = 4;
    mt::manual_seed(5);
    mt::nn::Linear layer(in, out, true);
    layer.add_lora({r, 2.0, 0.0}, base);
    {
      mt::autograd::NoGradGuard no_grad;
      Tensor b = layer.lora_B()->weight();
      b.copy_(mt::randn({out, r}));
    }
    const auto w0 = values(layer.weight());
    const Tensor x = mt::randn({3, in});
    Tensor adapter_out, merged_out;
    // A bf16 base runs under autocast, as the Trainer runs it (the adapters stay f32 masters).
    auto forward = [&] {
      mt::autograd::NoGradGuard no_grad;
      mt::amp::Autocast autocast(base == DType::bf16 ? DType::bf16 : DType::f32);
      return layer.forward(x).to(DType::f32);
    };
    adapter_out = forward();
    mt::nn::merge_lora(layer);
    merged_out = forward();
    EXPECT_TRUE(layer.lora_merged());
    // The merged weight is W0 + s B A, rounded once to the weight's dtype.
    const auto w = values(layer.weight()), A = values(layer.lora_A()->weight()), B = values(layer.lora_B()->weight());
    const double tol = base == DType::bf16 ? 1.0 / 128 : 1e-6;
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t j = 0; j < in; ++j) {
        double ba = 0;
        for (std::int64_t i = 0; i < r; ++i) ba += double(B[o * r + i]) * A[i * in + j];
        const double want = w0[o * in + j] + 2.0 * ba;
        EXPECT_NEAR(w[o * in + j], want, tol * (1 + std::abs(want))) << o << "," << j;
      }
    const auto yo = values(adapter_out), ym = values(merged_out);
    for (std::size_t k = 0; k < yo.size(); ++k) EXPECT_NEAR(ym[k], yo[k], (base == DType::bf16 ? 0.1 : 1e-4));
    EXPECT_THROW(layer.merge_lora(), mt::Error);
    mt::nn::unmerge_lora(layer);
    EXPECT_FALSE(layer.lora_merged());
    const auto back = values(layer.weight());
    EXPECT_EQ(std::memcmp(back.data(), w0.data(), w0.size() * sizeof(float)), 0);
    EXPECT_THROW(layer.unmerge_lora(), mt::Error);
  }
  auto plain = make_tiny_lm(false);
  EXPECT_NE(mt::test_support::error_of([&] { mt::nn::merge_lora(*plain); }).find("no LoRA adapter"),
            std::string::npos);
}

// ---- training the adapters -----------------------------------------------------------------------------

struct LoraRun {
  std::shared_ptr<mt::nn::Module> model;
  std::unique_ptr<mt::train::Trainer> trainer;
};

LoraRun make_run(const TrainerConfig& config) {
  const mt::train::RunInputs in = mt::test_support::inputs_for(false);
  LoraRun run;
  mt::manual_seed(config.seed);
  run.model = in.make_model();
  run.trainer = std::make_unique<mt::train::Trainer>(config, run.model, in.make_loss(run.model), in.train, in.val);
  return run;
}

TrainerConfig lora_config() {
  TrainerConfig c = mt::test_support::short_run_config();
  c.grad_clip = 0.0;
  c.lora = lora(4);
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.0});
  return c;
}

std::size_t lora_elements(const mt::nn::Module& m) {
  std::size_t n = 0;
  for (const auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) n += static_cast<std::size_t>(p.numel());
  return n;
}

// The gradients' peak over three steps of a GPT whose weights outweigh its activations (width 128, windows
// of 4, one window a step), from before the Trainer: there a gradient for the base would show.
struct GradientPeak {
  std::size_t peak = 0, params = 0, trained = 0, state = 0;
};

GradientPeak gradient_peak(const TrainerConfig& config) {
  mt::Allocator& cpu = mt::Allocator::get(mt::Device::cpu());
  const std::size_t before = cpu.stats()[mt::MemoryCategory::gradients].live_bytes;
  mt::manual_seed(config.seed);
  mt::nn::GPTConfig g;
  g.vocab_size = mt::test_support::kTinyVocab;
  g.block_size = 4;
  g.n_layer = 2;
  g.n_head = 2;
  g.n_embd = 128;
  auto gpt = std::make_shared<mt::nn::GPT>(g);
  auto data = std::make_shared<mt::test_support::TokenDataset>(8, 4, g.vocab_size);
  TrainerConfig c = config;
  c.micro_batch = 1;
  mt::train::Trainer trainer(c, gpt, mt::test_support::gpt_loss(gpt), data);  // resets the peak
  for (int i = 0; i < 3; ++i) trainer.train_step();
  GradientPeak out;
  out.peak = cpu.stats()[mt::MemoryCategory::gradients].peak_bytes - before;
  for (const auto& [name, p] : gpt->named_parameters()) {
    out.params += static_cast<std::size_t>(p.numel());
    if (p.requires_grad()) out.trained += static_cast<std::size_t>(p.numel());
  }
  out.state = trainer.optimizer().state_bytes();
  return out;
}

TEST(LoraTraining, TheFrozenBaseHasNoGradientAndNoOptimizerState) {
  TrainerConfig full = lora_config();
  full.lora.rank = 0;
  const GradientPeak f = gradient_peak(full), l = gradient_peak(lora_config());
  ASSERT_GT(l.trained, 0u);
  // Full fine-tuning holds every parameter's gradient (the measure sees them) and AdamW's m and v for each.
  EXPECT_GE(f.peak, 4 * f.params);
  EXPECT_EQ(f.state, 2 * 4 * f.params);
  // LoRA: the adapters' gradients and the backward's own transients (activation gradients of 4 tokens, a few
  // KiB here), nothing near the base's 4 x params bytes; state for the adapters only.
  std::printf("gradient peak: full fine-tuning %zu B (%zu parameters), LoRA %zu B (%zu trained)\n", f.peak, f.params,
              l.peak, l.trained);
  EXPECT_LE(l.peak, 4 * l.trained + 64 * 1024);
  EXPECT_LT(4 * l.trained + 64 * 1024, 4 * l.params / 4);  // so the bound above could fail
  EXPECT_EQ(l.state, 2 * 4 * l.trained);
}

TEST(LoraTraining, OnlyTheAdaptersMove) {
  LoraRun run = make_run(lora_config());
  const auto before = snapshot(*run.model);
  for (int i = 0; i < 3; ++i) run.trainer->train_step();
  const auto after = snapshot(*run.model);
  for (const auto& [name, p] : run.model->named_parameters()) {
    const bool adapter = name.find(".lora_") != std::string::npos;
    EXPECT_EQ(p.requires_grad(), adapter) << name;
    if (!adapter) {
      EXPECT_FALSE(p.grad().defined()) << name;
      EXPECT_EQ(after.at(name), before.at(name)) << name << " moved";
    } else if (name.find("lora_B") != std::string::npos) {
      EXPECT_NE(after.at(name), before.at(name)) << name << " did not train";
    }
  }
  EXPECT_LT(run.trainer->history().back().loss, run.trainer->history().front().loss);
}

TEST(LoraTraining, EveryOptimizerTrainsOnlyTheAdapters) {
  using mt::optim::Spec;
  const std::vector<std::pair<std::string, std::function<void(TrainerConfig&)>>> cases = {
      {"adamw8bit", [](TrainerConfig& c) { c.optimizer = Spec::adamw8bit({.lr = 1e-2, .min_8bit_size = 64}); }},
      {"lion", [](TrainerConfig& c) { c.optimizer = Spec::lion({.lr = 1e-3}); }},
      {"lion8bit", [](TrainerConfig& c) { c.optimizer = Spec::lion8bit({.lr = 1e-3, .min_8bit_size = 64}); }},
      {"sgd", [](TrainerConfig& c) { c.optimizer = Spec::sgd({.lr = 0.5}); }},
      {"adafactor", [](TrainerConfig& c) { c.optimizer = Spec::adafactor({.lr = 1e-2}); }},
      {"galore adamw", [](TrainerConfig& c) {
         c.galore_rank = 2;
         c.galore_targets = {"*.lora_B.weight"};
       }},
      {"bf16", [](TrainerConfig& c) { c.precision = mt::amp::Precision::bf16; }},
      {"fp16", [](TrainerConfig& c) { c.precision = mt::amp::Precision::fp16; }},
      {"fp8", [](TrainerConfig& c) { c.precision = mt::amp::Precision::fp8; }},
  };
  for (const auto& [name, configure] : cases) {
    SCOPED_TRACE(name);
    TrainerConfig c = lora_config();
    configure(c);
    LoraRun run = make_run(c);
    const auto before = snapshot(*run.model);
    for (int i = 0; i < 3; ++i) run.trainer->train_step();
    const auto after = snapshot(*run.model);
    bool adapters_moved = false;
    for (const auto& [pname, v] : after) {
      if (pname.find(".lora_") == std::string::npos) EXPECT_EQ(v, before.at(pname)) << pname << " moved";
      else adapters_moved = adapters_moved || v != before.at(pname);
    }
    EXPECT_TRUE(adapters_moved);
    for (const auto& m : run.trainer->history()) EXPECT_TRUE(std::isfinite(m.loss));
  }
}

TEST(LoraTraining, LayerwiseCheckpointingAndAccumulationGiveTheSameBits) {
  TrainerConfig plain = lora_config();
  plain.grad_accum = 2;
  TrainerConfig other = plain;
  other.layerwise_update = true;
  other.activation_checkpointing = mt::ckpt::Policy::full();
  LoraRun a = make_run(plain), b = make_run(other);
  for (int i = 0; i < 3; ++i) {
    a.trainer->train_step();
    b.trainer->train_step();
  }
  EXPECT_EQ(snapshot(*a.model), snapshot(*b.model));
}

TEST(LoraTraining, TheConfigRoundTripsAndTheTrainerRefusesASecondSetOfAdapters) {
  TrainerConfig c = lora_config();
  c.lora.alpha = 32;
  c.lora.dropout = 0.05;
  c.lora.rslora = true;
  c.lora.targets = {"c_attn", "h.1.*"};
  const TrainerConfig back = TrainerConfig::from_json(c.to_json());
  EXPECT_EQ(back.lora.rank, 4);
  EXPECT_EQ(back.lora.alpha, 32);
  EXPECT_EQ(back.lora.dropout, 0.05);
  EXPECT_TRUE(back.lora.rslora);
  EXPECT_EQ(back.lora.targets, c.lora.targets);
  nlohmann::json j = c.to_json();
  j["lora"]["rnak"] = 3;
  EXPECT_NE(mt::test_support::error_of([&] { (void)TrainerConfig::from_json(j); }).find("rnak"), std::string::npos);
  j = c.to_json();
  j["lora"]["dropout"] = 1.5;
  EXPECT_NE(mt::test_support::error_of([&] { TrainerConfig::from_json(j).validate(); }).find("lora"),
            std::string::npos);

  const mt::train::RunInputs in = mt::test_support::inputs_for(false);
  auto model = in.make_model();
  mt::nn::apply_lora(*model, lora(2));
  const std::string msg = mt::test_support::error_of(
      [&] { mt::train::Trainer t(lora_config(), model, in.make_loss(model), in.train, in.val); });
  EXPECT_NE(msg.find("adapters already"), std::string::npos) << msg;
  // With lora.rank 0 the Trainer trains the model's own adapters, and only them.
  TrainerConfig own = lora_config();
  own.lora.rank = 0;
  mt::train::Trainer t(own, model, in.make_loss(model), in.train, in.val);
  t.train_step();
  EXPECT_EQ(t.optimizer().state_bytes(), 2 * 4 * lora_elements(*model));
}

// ---- QLoRA: the frozen base in NF4 ---------------------------------------------------------------------

TEST(Qlora, StoresTheBaseIn4Point127BitsAWeightExactlyInTheAccounting) {
  mt::Allocator& cpu = mt::Allocator::get(mt::Device::cpu());
  auto gpt = make_tiny_lm(false);
  LoraConfig c = lora(4);
  c.quantize_nf4 = true;
  const std::size_t params_before = cpu.stats()[mt::MemoryCategory::parameters].live_bytes;
  std::size_t dense = 0, expected_nf4 = 0, adapters = 0;
  for (const auto& [path, layer] : mt::nn::lora_targets(*gpt, c)) {
    const auto n = static_cast<std::size_t>(layer->in_features() * layer->out_features());
    dense += 4 * n;
    // 4 bits a weight, one u8 absmax code per 64, one f32 scale per 256 codes, one f32 offset per matrix.
    expected_nf4 += n / 2 + n / 64 + 4 * ((n / 64 + 255) / 256) + 4;
    adapters += 4 * static_cast<std::size_t>(4 * (layer->in_features() + layer->out_features()));
  }
  const auto adapted = mt::nn::apply_lora(*gpt, c);
  const std::size_t params_after = cpu.stats()[mt::MemoryCategory::parameters].live_bytes;
  EXPECT_EQ(params_after + dense, params_before + expected_nf4 + adapters);
  for (const auto& [path, layer] : adapted) {
    EXPECT_TRUE(layer->weight_is_nf4()) << path;
    const auto n = static_cast<double>(layer->in_features() * layer->out_features());
    // 4.127 bits a weight when the matrix fills its 256-blocks of absmax codes (c_attn: 3072 weights do not).
    if (static_cast<std::int64_t>(n) % (64 * 256) == 0)
      EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(layer->nf4_weight().bytes()) / n, 4.0 + 8.0 / 64 + 32.0 / (64 * 256));
  }
  // The names are bitsandbytes': the codes under "weight", the rest beside it; no float "weight" parameter left.
  std::set<std::string> buffers;
  for (const auto& [name, t] : gpt->named_buffers()) buffers.insert(name);
  for (const char* suffix : {"weight", "weight.absmax", "weight.nested_absmax", "weight.nested_offset"})
    EXPECT_EQ(buffers.count(std::string("h.0.mlp.c_fc.") + suffix), 1u) << suffix;
  for (const auto& [name, p] : gpt->named_parameters()) EXPECT_NE(name, "h.0.mlp.c_fc.weight");
  EXPECT_THROW(mt::nn::merge_lora(*gpt), mt::Error);
}

TEST(Qlora, StartsAtTheQuantisedBaseAndTrainsOnlyTheAdapters) {
  // The same model with every adapted weight replaced by its NF4 round trip computes the same loss.
  mt::manual_seed(13);
  auto qlora = std::static_pointer_cast<mt::nn::GPT>(make_tiny_lm(false));
  mt::manual_seed(13);
  auto rounded = std::static_pointer_cast<mt::nn::GPT>(make_tiny_lm(false));
  LoraConfig c = lora(4);
  c.quantize_nf4 = true;
  mt::nn::apply_lora(*qlora, c);
  {
    mt::autograd::NoGradGuard no_grad;
    for (const auto& [path, layer] : mt::nn::lora_targets(*rounded, c)) {
      Tensor w = layer->weight();
      w.copy_(mt::ops::nf4_dequantize(mt::ops::nf4_quantize(w), DType::f32));
    }
  }
  const float a = gpt_loss_value(*qlora, false), b = gpt_loss_value(*rounded, false);
  EXPECT_NEAR(a, b, 1e-5 * std::abs(b));
  mt::manual_seed(13);
  auto plain = std::static_pointer_cast<mt::nn::GPT>(make_tiny_lm(false));
  EXPECT_NE(a, gpt_loss_value(*plain, false));  // the rounding is visible: the check above could fail

  TrainerConfig config = lora_config();
  config.lora.quantize_nf4 = true;
  config.precision = mt::amp::Precision::bf16;
  LoraRun run = make_run(config);
  std::map<std::string, std::vector<std::uint8_t>> codes;
  auto code_bytes = [](const Tensor& t) {
    const Tensor c = t.contiguous();
    return std::vector<std::uint8_t>(c.data<std::uint8_t>(), c.data<std::uint8_t>() + c.numel());
  };
  for (const auto& [name, t] : run.model->named_buffers())
    if (t.dtype() == DType::u8) codes[name] = code_bytes(t);
  ASSERT_EQ(codes.size(), 16u);  // codes and absmax codes of 8 layers
  const auto before = snapshot(*run.model);
  for (int i = 0; i < 3; ++i) run.trainer->train_step();
  for (const auto& [name, t] : run.model->named_buffers())
    if (t.dtype() == DType::u8) EXPECT_EQ(code_bytes(t), codes.at(name)) << name;
  const auto after = snapshot(*run.model);
  bool adapters_moved = false;
  for (const auto& [name, v] : after) {
    if (name.find(".lora_") == std::string::npos) EXPECT_EQ(v, before.at(name)) << name;
    else adapters_moved = adapters_moved || v != before.at(name);
  }
  EXPECT_TRUE(adapters_moved);
  EXPECT_LT(run.trainer->history().back().loss, run.trainer->history().front().loss);
  EXPECT_EQ(run.trainer->optimizer().state_bytes(), 2 * 4 * lora_elements(*run.model));

  // A checkpoint holds the NF4 buffers and resumes them.
  mt::test_support::TempDir dir;
  run.trainer->save_checkpoint(dir.file("q.safetensors"));
  LoraRun resumed = make_run(config);
  resumed.trainer->load_checkpoint(dir.file("q.safetensors"));
  EXPECT_EQ(snapshot(*resumed.model), after);
  for (const auto& [name, t] : resumed.model->named_buffers())
    if (t.dtype() == DType::u8) EXPECT_EQ(code_bytes(t), codes.at(name)) << name;
}

}  // namespace
