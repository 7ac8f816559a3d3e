// LoRA adapters on disk in PEFT's layout (nn/lora_adapter.h): a round trip through the files gives the same
// model bit for bit; the key names and config keys are PEFT's; what does not fit the model is refused naming
// the key and both shapes; and an adapter that Hugging Face PEFT wrote (tests/fixtures/peft_lora, made by
// scripts/make_peft_lora_fixture.py) gives PEFT's logits.
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/rng.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/hf_gpt2.h"
#include "memtrain/nn/lora.h"
#include "memtrain/nn/lora_adapter.h"
#include "memtrain/ops/elementwise.h"

#include "error_text.h"
#include "temp_dir.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <tuple>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::DType;
using mt::Tensor;
using mt::nn::LoraConfig;
using mt::test_support::error_of;
using mt::test_support::TempDir;

namespace {

const std::string kFixture = std::string(MEMTRAIN_FIXTURES_DIR) + "/peft_lora";

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.detach().to(DType::f32).contiguous();
  return {c.data<float>(), c.data<float>() + c.numel()};
}

std::shared_ptr<mt::nn::GPT> tiny_gpt() {
  mt::manual_seed(21);
  return std::static_pointer_cast<mt::nn::GPT>(mt::test_support::make_tiny_lm(false));
}

LoraConfig config(std::int64_t rank, std::vector<std::string> targets = {}) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = 12;
  c.targets = std::move(targets);
  return c;
}

// Adapters with B moved off zero, so that they change the output.
void randomize_adapters(mt::nn::Module& m) {
  mt::autograd::NoGradGuard no_grad;
  for (const auto& [path, layer] : mt::nn::lora_layers(m)) {
    Tensor b = layer->lora_B()->weight();
    b.copy_(mt::randn(b.shape()) * 0.05);
  }
}

Tensor ids() {
  std::vector<std::int64_t> v;
  for (int i = 0; i < 2 * 12; ++i) v.push_back((i * 11 + 3) % mt::test_support::kTinyVocab);
  return mt::tensor(v, {2, 12});
}

std::vector<float> logits(const mt::nn::GPT& gpt, const Tensor& idx) {
  mt::autograd::NoGradGuard no_grad;
  return values(gpt.forward(idx));
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

TEST(LoraAdapter, RoundTripsThroughPeftsFilesBitForBit) {
  TempDir dir;
  auto trained = tiny_gpt();
  const LoraConfig c = config(4, {"c_attn", "mlp.c_proj"});
  mt::nn::apply_lora(*trained, c);
  randomize_adapters(*trained);
  mt::nn::save_lora_adapter(*trained, c, dir.path());

  // PEFT's names and settings.
  const auto tensors = mt::io::load_safetensors(dir.file("adapter_model.safetensors"));
  ASSERT_EQ(tensors.size(), 8u);
  const Tensor& a = tensors.at("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  EXPECT_EQ(a.shape(), (mt::Shape{4, 32}));
  EXPECT_EQ(tensors.at("base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight").shape(), (mt::Shape{32, 4}));
  EXPECT_EQ(mt::io::load_safetensors_metadata(dir.file("adapter_model.safetensors")).at("format"), "pt");
  const nlohmann::json j = read_json(dir.file("adapter_config.json"));
  EXPECT_EQ(j.at("peft_type"), "LORA");
  EXPECT_EQ(j.at("r"), 4);
  EXPECT_EQ(j.at("lora_alpha"), 12.0);
  EXPECT_EQ(j.at("bias"), "none");
  EXPECT_EQ(j.at("use_rslora"), false);
  EXPECT_EQ(j.at("fan_in_fan_out"), true);
  EXPECT_EQ(j.at("target_modules"),
            (nlohmann::json{"transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_proj", "transformer.h.1.attn.c_attn",
                            "transformer.h.1.mlp.c_proj"}));

  // A fresh copy of the base takes its settings and layers from the files.
  auto loaded = tiny_gpt();
  const LoraConfig read = mt::nn::read_lora_adapter_config(*loaded, dir.path());
  EXPECT_EQ(read.rank, 4);
  EXPECT_EQ(read.alpha, 12.0);
  EXPECT_FALSE(read.rslora);
  EXPECT_EQ(read.targets, (std::vector<std::string>{"h.0.attn.c_attn", "h.0.mlp.c_proj", "h.1.attn.c_attn",
                                                    "h.1.mlp.c_proj"}));
  mt::nn::apply_lora(*loaded, read);
  mt::nn::load_lora_adapter(*loaded, dir.path());
  const auto want = logits(*trained, ids()), got = logits(*loaded, ids());
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  // And the adapters changed the output: the comparison above could fail.
  auto base = tiny_gpt();
  EXPECT_NE(logits(*base, ids()), want);
}

TEST(LoraAdapter, AnAdapterThatDoesNotFitIsRefusedNamingTheKeyAndBothShapes) {
  TempDir dir;
  auto source = tiny_gpt();
  mt::nn::apply_lora(*source, config(4, {"c_fc"}));
  mt::nn::save_lora_adapter(*source, config(4, {"c_fc"}), dir.path());

  // Rank 2 adapters on the same layers: the file's [4, 32] against the model's [2, 32].
  auto other = tiny_gpt();
  mt::nn::apply_lora(*other, config(2, {"c_fc"}));
  const auto before = values(other->named_parameters().back().second);
  std::string msg = error_of([&] { mt::nn::load_lora_adapter(*other, dir.path()); });
  EXPECT_NE(msg.find("base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight: the file has [4, 32]"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("the model [2, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has rank 2"), std::string::npos) << msg;

  // Adapters on other layers: the model's keys are missing, the file's unexpected.
  auto elsewhere = tiny_gpt();
  mt::nn::apply_lora(*elsewhere, config(4, {"c_attn"}));
  msg = error_of([&] { mt::nn::load_lora_adapter(*elsewhere, dir.path()); });
  EXPECT_NE(msg.find("missing: base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("without an adapter in the model: base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight"),
            std::string::npos) << msg;

  // A model of another width: no Linear of it has the file's names? It has; the shapes then differ.
  mt::nn::GPTConfig wide;
  wide.vocab_size = mt::test_support::kTinyVocab;
  wide.block_size = 16;
  wide.n_layer = 2;
  wide.n_head = 2;
  wide.n_embd = 48;
  mt::nn::GPT big(wide);
  mt::nn::apply_lora(big, config(4, {"c_fc"}));
  msg = error_of([&] { mt::nn::load_lora_adapter(big, dir.path()); });
  EXPECT_NE(msg.find("lora_A.weight: the file has [4, 32] f32, the model [4, 48]"), std::string::npos) << msg;

  // A model without adapters at all.
  auto bare = tiny_gpt();
  EXPECT_NE(error_of([&] { mt::nn::load_lora_adapter(*bare, dir.path()); }).find("no LoRA adapters"),
            std::string::npos);
  // Nothing was copied by the refused loads.
  EXPECT_EQ(values(other->named_parameters().back().second), before);
}

TEST(LoraAdapter, RefusesConfigsItCannotHonour) {
  TempDir dir;
  auto source = tiny_gpt();
  mt::nn::apply_lora(*source, config(4, {"c_fc"}));
  mt::nn::save_lora_adapter(*source, config(4, {"c_fc"}), dir.path());
  const nlohmann::json good = read_json(dir.file("adapter_config.json"));
  const std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {"peft_type", "PREFIX_TUNING"}, {"bias", "all"},          {"use_dora", true},
      {"rank_pattern", {{"c_fc", 8}}}, {"modules_to_save", {"wte"}}, {"r", 0},
      {"r", "four"},
  };
  for (const auto& [key, value] : bad) {
    SCOPED_TRACE(key);
    nlohmann::json j = good;
    j[key] = value;
    write_json(dir.file("adapter_config.json"), j);
    auto model = tiny_gpt();
    const std::string msg = error_of([&] { (void)mt::nn::read_lora_adapter_config(*model, dir.path()); });
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
    EXPECT_NE(msg.find("adapter_config.json"), std::string::npos) << msg;
  }
  // A tensor that is no adapter weight of the model's Linears.
  write_json(dir.file("adapter_config.json"), good);
  auto tensors = mt::io::load_safetensors(dir.file("adapter_model.safetensors"));
  tensors["base_model.model.transformer.wte.lora_embedding_A"] = mt::zeros({4, 64});
  mt::io::save_safetensors(dir.file("adapter_model.safetensors"), tensors);
  auto model = tiny_gpt();
  EXPECT_NE(error_of([&] { (void)mt::nn::read_lora_adapter_config(*model, dir.path()); }).find("lora_embedding_A"),
            std::string::npos);
  // Saving refuses a merged adapter and a model without one.
  mt::nn::merge_lora(*source);
  EXPECT_NE(error_of([&] { mt::nn::save_lora_adapter(*source, config(4), dir.path()); }).find("merged"),
            std::string::npos);
  EXPECT_NE(error_of([&] { mt::nn::save_lora_adapter(*model, config(4), dir.path()); }).find("no LoRA adapter"),
            std::string::npos);
}

// PEFT's logits in float64 against memtrain's in f32: max |diff| over max |ref| within 1e-5.
void expect_logits(const mt::nn::GPT& gpt, const std::map<std::string, Tensor>& expected, const std::string& name) {
  SCOPED_TRACE(name);
  const std::vector<float> got = logits(gpt, expected.at("input_ids"));
  const Tensor ref = expected.at(name).contiguous();
  ASSERT_EQ(ref.dtype(), DType::f64);
  ASSERT_EQ(static_cast<std::int64_t>(got.size()), ref.numel());
  const double* r = ref.data<double>();
  double worst = 0, scale = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    worst = std::max(worst, std::abs(got[k] - r[k]));
    scale = std::max(scale, std::abs(r[k]));
  }
  EXPECT_LE(worst, 1e-5 * scale) << "max |diff| " << worst << " against max |logit| " << scale;
}

TEST(LoraAdapter, GivesPeftsLogitsForAnAdapterPeftWrote) {
  const auto expected = mt::io::load_safetensors(kFixture + "/expected.safetensors");
  for (const auto& [dir, logits_name, layers] :
       {std::tuple{"adapter", "logits_adapter", 8u}, std::tuple{"adapter_rslora", "logits_adapter_rslora", 2u}}) {
    SCOPED_TRACE(dir);
    auto gpt = mt::nn::gpt2_from_pretrained(kFixture + "/base");
    expect_logits(*gpt, expected, "logits_base");
    const LoraConfig c = mt::nn::read_lora_adapter_config(*gpt, kFixture + "/" + dir);
    EXPECT_EQ(c.rank, 4);
    EXPECT_EQ(c.alpha, 8.0);
    EXPECT_EQ(c.rslora, std::string(dir) == "adapter_rslora");
    EXPECT_EQ(mt::nn::apply_lora(*gpt, c).size(), layers);
    mt::nn::load_lora_adapter(*gpt, kFixture + "/" + dir);
    expect_logits(*gpt, expected, logits_name);
  }
}

}  // namespace
