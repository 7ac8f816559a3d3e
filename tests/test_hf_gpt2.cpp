// Hugging Face GPT-2 checkpoints: nn::GPT loaded from tests/fixtures/hf_gpt2/ against PyTorch.
//
// scripts/make_hf_gpt2_fixture.py wrote a small GPT-2 (V 96, n_positions 32, C 32, L 2, H 4) as
// transformers lays it out (F32 with the "transformer." prefix, mask buffers and lm_head; F16 and BF16
// copies without prefix) and the loss and logits of HF's GPT2LMHeadModel computation in float64 on a fixed
// batch. Nothing in the reference comes from memtrain.
//
// Error measure: normwise relative error ||got - ref||_2 / ||ref||_2 (the loss: |got - ref| / |ref|).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "temp_dir.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/hf_gpt2.h"

namespace memtrain {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(MEMTRAIN_FIXTURES_DIR) + "/hf_gpt2";
const std::string kModel = kDir + "/model.safetensors";

// f32: the forward is ~20 ops deep; PyTorch's own f32 run lands 7e-8 from its f64 run (printed by the script).
// 1e-5 is the project's f32 bar and a missed transpose moves the logits by O(1) (WrongTransposeIsCaught).
constexpr double kTolF32 = 1e-5;
// f64: only summation order and libm differ.
constexpr double kTolF64 = 1e-10;

using memtrain::test_support::TempDir;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::map<std::string, Tensor>& expected() {
  static const std::map<std::string, Tensor> e = io::load_safetensors(kDir + "/expected.safetensors");
  return e;
}

double normwise_error(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  const Tensor g = got.detach().to(DType::f64).contiguous(), r = ref.to(DType::f64).contiguous();
  double d2 = 0.0, r2 = 0.0;
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    const double d = g.data<double>()[i] - r.data<double>()[i];
    d2 += d * d;
    r2 += r.data<double>()[i] * r.data<double>()[i];
  }
  return std::sqrt(d2 / r2);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.detach().contiguous(), y = b.detach().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Loss and logits of `model` on the fixture batch, each as its relative error against PyTorch.
struct Errors {
  double loss = 0.0;
  double logits = 0.0;
};
Errors errors_against_torch(const nn::GPT& model, const std::string& loss_key = "loss") {
  autograd::NoGradGuard no_grad;
  const Tensor& idx = expected().at("idx");
  const double ref = expected().at(loss_key).item();
  Errors e;
  e.loss = std::abs(model.loss(idx, expected().at("targets")).item() - ref) / std::abs(ref);
  e.logits = normwise_error(model.forward(idx), expected().at("logits"));
  return e;
}

// Expects `fn` to throw memtrain::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no memtrain::Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(HfGpt2, ConfigFromJson) {
  const nn::GPTConfig c = nn::gpt2_config_from_hf_json(kDir + "/config.json");
  EXPECT_EQ(c.vocab_size, 96);
  EXPECT_EQ(c.block_size, 32);
  EXPECT_EQ(c.n_embd, 32);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_DOUBLE_EQ(c.dropout, 0.1);  // resid_pdrop
  EXPECT_TRUE(c.bias);
  EXPECT_EQ(nn::gpt2_from_pretrained(kDir, {}, 0.0)->config().dropout, 0.0);  // caller's override
}

TEST(HfGpt2, LoadedModelMatchesTorch) {
  for (DType dtype : {DType::f32, DType::f64}) {
    auto model = nn::gpt2_from_pretrained(kDir, {}, {}, dtype);
    EXPECT_FALSE(model->is_training());  // eval, as from_pretrained returns it: dropout 0.1 would be on
    const Errors e = errors_against_torch(*model);
    std::printf("  [%s] loss rel error %.2e   logits normwise %.2e\n", std::string(dtype_name(dtype)).c_str(),
                e.loss, e.logits);
    const double tol = dtype == DType::f32 ? kTolF32 : kTolF64;
    EXPECT_LE(e.loss, tol);
    EXPECT_LE(e.logits, tol);
  }
}

TEST(HfGpt2, WrongTransposeIsCaught) {
  // The negative control for the tolerance above: c_proj is square, so a loader that forgot to transpose
  // it would load without a shape error. The golden comparison must see it.
  auto model = nn::gpt2_from_pretrained(kDir);
  Tensor w = model->state_dict().at("h.0.attn.c_proj.weight");
  w.copy_(w.t().contiguous());
  const Errors e = errors_against_torch(*model);
  std::printf("  c_proj left [in, out]: logits normwise %.2e\n", e.logits);
  EXPECT_GT(e.logits, 1e-2);
}

TEST(HfGpt2, ReportsIgnoredNamesAndTransposesConv1D) {
  nn::GPT model(nn::gpt2_config_from_hf_json(kDir + "/config.json"));
  std::vector<std::string> ignored = nn::load_hf_gpt2(model, kModel);
  std::sort(ignored.begin(), ignored.end());
  const std::vector<std::string> want = {"lm_head.weight", "transformer.h.0.attn.bias",
                                         "transformer.h.0.attn.masked_bias", "transformer.h.1.attn.bias",
                                         "transformer.h.1.attn.masked_bias"};
  EXPECT_EQ(ignored, want);

  const auto file = io::load_safetensors(kModel);
  const nn::StateDict sd = model.state_dict();
  EXPECT_EQ(file.at("transformer.h.1.mlp.c_fc.weight").shape(), (Shape{32, 128}));
  EXPECT_EQ(sd.at("h.1.mlp.c_fc.weight").shape(), (Shape{128, 32}));
  for (const auto& [name, t] : sd) {
    const Tensor& f = file.at("transformer." + name);
    const bool conv = name.find(".c_") != std::string::npos && name.find(".weight") != std::string::npos;
    EXPECT_TRUE(bitwise_equal(t, conv ? f.t() : f)) << name;
  }
}

TEST(HfGpt2, FilePathAndInferredConfig) {
  // A .safetensors path finds config.json beside it; a caller's n_head that contradicts it is refused.
  EXPECT_EQ(nn::gpt2_from_pretrained(kModel)->config().n_head, 4);
  expect_error([] { nn::gpt2_from_pretrained(kModel, 8); }, {"n_head 8", "config.json", "n_head 4"});

  // Without config.json the sizes come from the shapes, but n_head has to be given.
  TempDir tmp;
  fs::copy_file(kModel, tmp.file("model.safetensors"));
  expect_error([&] { nn::gpt2_from_pretrained(tmp.path()); }, {tmp.file("model.safetensors"), "n_head"});
  auto model = nn::gpt2_from_pretrained(tmp.path(), 4);
  const nn::GPTConfig& c = model->config();
  EXPECT_EQ(c.vocab_size, 96);
  EXPECT_EQ(c.block_size, 32);
  EXPECT_EQ(c.n_embd, 32);
  EXPECT_EQ(c.n_layer, 2);
  const Errors e = errors_against_torch(*model);
  EXPECT_LE(e.loss, kTolF32);
  EXPECT_LE(e.logits, kTolF32);

  expect_error([&] { nn::gpt2_from_pretrained(tmp.file("nothing.safetensors"), 4); },
               {"nothing.safetensors", "no such file"});
  TempDir empty;
  expect_error([&] { nn::gpt2_from_pretrained(empty.path()); }, {empty.file("model.safetensors"), "no such file"});
}

TEST(HfGpt2, SaveRoundTrip) {
  auto model = nn::gpt2_from_pretrained(kDir);
  TempDir tmp;
  const std::string path = tmp.file("model.safetensors");
  nn::save_hf_gpt2(*model, path);

  // The saved file is HF's GPT2Model layout and holds the fixture's exact bytes under the unprefixed names.
  const auto saved = io::load_safetensors(path);
  const auto original = io::load_safetensors(kModel);
  EXPECT_EQ(saved.size(), model->named_parameters().size());
  for (const auto& [name, t] : saved) {
    EXPECT_EQ(name.rfind("transformer.", 0), std::string::npos) << name;
    EXPECT_EQ(t.dtype(), DType::f32) << name;
    ASSERT_EQ(original.count("transformer." + name), 1u) << name;
    EXPECT_TRUE(bitwise_equal(t, original.at("transformer." + name))) << name;
  }
  EXPECT_EQ(saved.at("h.0.attn.c_attn.weight").shape(), (Shape{32, 96}));  // Conv1D [in, out]
  EXPECT_EQ(saved.at("h.0.mlp.c_proj.weight").shape(), (Shape{128, 32}));
  EXPECT_EQ(io::load_safetensors_metadata(path).at("format"), "pt");

  const nn::GPTConfig c = nn::gpt2_config_from_hf_json(tmp.file("config.json"));
  const nn::GPTConfig& m = model->config();
  EXPECT_EQ(std::make_tuple(c.vocab_size, c.block_size, c.n_embd, c.n_layer, c.n_head, c.dropout),
            std::make_tuple(m.vocab_size, m.block_size, m.n_embd, m.n_layer, m.n_head, m.dropout));
  EXPECT_NE(read_text(tmp.file("config.json")).find("\"activation_function\": \"gelu_new\""), std::string::npos);

  auto again = nn::gpt2_from_pretrained(tmp.path());
  const nn::StateDict a = model->state_dict(), b = again->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(bitwise_equal(t, b.at(name))) << name;
}

TEST(HfGpt2, HalfPrecisionFiles) {
  // The F16 / BF16 files hold torch's rounding of the F32 weights: loaded into an f32 model they must equal
  // memtrain's own rounding of the F32 file, and the loss must match torch's for those rounded weights.
  auto full = nn::gpt2_from_pretrained(kDir);
  const nn::StateDict ref = full->state_dict();
  for (const auto& [file, dtype, loss_key] : {std::make_tuple("model_f16.safetensors", DType::f16, "loss_f16"),
                                              std::make_tuple("model_bf16.safetensors", DType::bf16, "loss_bf16")}) {
    SCOPED_TRACE(file);
    const std::string path = kDir + "/" + file;
    EXPECT_EQ(io::load_safetensors(path).at("wte.weight").dtype(), dtype);
    auto model = nn::gpt2_from_pretrained(path);
    ASSERT_EQ(model->state_dict().at("wte.weight").dtype(), DType::f32);
    int differ = 0;
    for (const auto& [name, t] : model->state_dict()) {
      EXPECT_TRUE(bitwise_equal(t, ref.at(name).to(dtype).to(DType::f32))) << name;
      differ += bitwise_equal(t, ref.at(name)) ? 0 : 1;
    }
    EXPECT_GT(differ, 0);  // the rounding is real, so the equality above is not vacuous
    const Errors e = errors_against_torch(*model, loss_key);
    std::printf("  [%s] loss rel error vs torch on the rounded weights %.2e\n", file, e.loss);
    EXPECT_LE(e.loss, kTolF32);
  }
  // The F16 file is laid out as the hub's gpt2: no prefix, float mask buffers, no lm_head.
  nn::GPT model(full->config());
  EXPECT_EQ(nn::load_hf_gpt2(model, kDir + "/model_f16.safetensors"),
            (std::vector<std::string>{"h.0.attn.bias", "h.1.attn.bias"}));
  EXPECT_TRUE(nn::load_hf_gpt2(model, kDir + "/model_bf16.safetensors").empty());
}

TEST(HfGpt2, BadCheckpointsNameFileAndTensor) {
  const nn::GPTConfig cfg = nn::gpt2_config_from_hf_json(kDir + "/config.json");
  const auto original = io::load_safetensors(kModel);
  TempDir tmp;
  auto write_variant = [&](const std::string& name, auto&& edit) {
    std::map<std::string, Tensor> tensors = original;
    edit(tensors);
    const std::string path = tmp.file(name);
    io::save_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors.begin(), tensors.end()));
    return path;
  };
  nn::GPT model(cfg);
  const Tensor before = model.state_dict().at("wte.weight").clone();

  // Saved in nn::Linear's [out, in] instead of Conv1D's [in, out].
  const std::string bad_shape = write_variant("bad_shape.safetensors", [](auto& t) {
    t["transformer.h.1.mlp.c_fc.weight"] = t["transformer.h.1.mlp.c_fc.weight"].t().contiguous();
  });
  expect_error([&] { nn::load_hf_gpt2(model, bad_shape); },
               {bad_shape, "shape mismatch", "transformer.h.1.mlp.c_fc.weight", "[128, 32]", "[32, 128]"});

  const std::string missing =
      write_variant("missing.safetensors", [](auto& t) { t.erase("transformer.h.0.ln_2.bias"); });
  expect_error([&] { nn::load_hf_gpt2(model, missing); }, {missing, "missing tensors", "h.0.ln_2.bias"});

  const std::string extra = write_variant("extra.safetensors", [](auto& t) {
    t["transformer.h.2.ln_1.weight"] = t["transformer.h.0.ln_1.weight"];  // a third block
  });
  expect_error([&] { nn::load_hf_gpt2(model, extra); }, {extra, "unexpected tensors", "transformer.h.2.ln_1.weight"});

  const std::string ints = write_variant("ints.safetensors", [](auto& t) {
    t["transformer.wpe.weight"] = t["transformer.wpe.weight"].to(DType::i64);
  });
  expect_error([&] { nn::load_hf_gpt2(model, ints); }, {ints, "transformer.wpe.weight (I64)"});

  const std::string twice =
      write_variant("twice.safetensors", [](auto& t) { t["wte.weight"] = t["transformer.wte.weight"]; });
  expect_error([&] { nn::load_hf_gpt2(model, twice); }, {twice, "wte.weight", "transformer.wte.weight"});

  // A refused file leaves the model as it was.
  EXPECT_TRUE(bitwise_equal(model.state_dict().at("wte.weight"), before));

  // A model of another size: every mismatch is listed, against the file.
  nn::GPTConfig other = cfg;
  other.n_embd = 64;
  nn::GPT wide(other);
  expect_error([&] { nn::load_hf_gpt2(wide, kModel); }, {kModel, "n_embd 64", "transformer.wte.weight (file [96, 32]"});
}

TEST(HfGpt2, BadConfigsNameFileAndKey) {
  const std::string good = read_text(kDir + "/config.json");
  TempDir tmp;
  auto variant = [&](const std::string& from, const std::string& to) {
    const auto at = good.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    std::string text = good;
    text.replace(at, from.size(), to);
    const std::string path = tmp.file("config.json");
    write_text(path, text);
    return path;
  };
  expect_error([&] { nn::gpt2_config_from_hf_json(variant("\"gelu_new\"", "\"relu\"")); },
               {tmp.file("config.json"), "activation_function", "relu"});
  expect_error([&] { nn::gpt2_config_from_hf_json(variant("1e-05", "1e-06")); },
               {tmp.file("config.json"), "layer_norm_epsilon"});
  expect_error([&] { nn::gpt2_config_from_hf_json(variant("\"n_head\": 4", "\"n_head\": 5")); },
               {tmp.file("config.json"), "not divisible"});
  expect_error([&] { nn::gpt2_config_from_hf_json(variant("\"n_head\": 4,", "")); },
               {tmp.file("config.json"), "n_head"});
  expect_error([&] { nn::gpt2_config_from_hf_json(variant("\"n_inner\": null", "\"n_inner\": 64")); },
               {tmp.file("config.json"), "n_inner 64"});
  expect_error([&] { nn::gpt2_config_from_hf_json(variant("{", "[")); }, {tmp.file("config.json"), "JSON"});
  expect_error([&] { nn::gpt2_config_from_hf_json(tmp.file("absent.json")); }, {"absent.json", "cannot open"});

  // gpt2_from_pretrained reads the config beside the file, so a relu config refuses the whole checkpoint.
  variant("\"gelu_new\"", "\"relu\"");
  fs::copy_file(kModel, tmp.file("model.safetensors"));
  expect_error([&] { nn::gpt2_from_pretrained(tmp.path()); }, {tmp.file("config.json"), "relu"});
}

}  // namespace
}  // namespace memtrain
