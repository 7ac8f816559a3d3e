// Faults a long run meets, and what the Trainer does about them:
// - a NaN or Inf in the loss or in any gradient, at fp32 and bf16 (fp16's overflow has its own test), skips the
//   whole step: no weight and no optimizer state moves, even those whose own gradient was finite; metrics
//   and the summary say so; max_bad_steps skipped steps in a row stop fit() with the last good checkpoint
//   kept;
// - a save that runs out of room (a file-size limit here, a full disk in life) fails naming the file and the
//   bytes it needs, and the previous checkpoint stays whole;
// - a checkpoint directory that cannot be written is refused before the first step.
#include "memtrain/core/rng.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/train/train.h"

#include "error_text.h"
#include "file_size_limit.h"
#include "temp_dir.h"
#include "token_dataset.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace mt = memtrain;
namespace fs = std::filesystem;
using mt::Tensor;
using mt::test_support::error_of;
using mt::test_support::FileSizeLimit;
using mt::test_support::TempDir;
using mt::test_support::TokenDataset;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::shared_ptr<mt::nn::GPT> make_gpt() {
  mt::manual_seed(11);
  mt::nn::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return std::make_shared<mt::nn::GPT>(c);
}

TrainerConfig config(const std::string& precision) {
  TrainerConfig c;
  c.precision = mt::amp::parse_precision(precision);
  c.data.prefetch = 1;
  c.schedule.decay = mt::train::LrDecay::constant;
  c.grad_clip = 1.0;
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.max_steps = 6;
  c.eval_interval = 0;
  c.log_interval = 1000;
  c.optimizer = mt::optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
  return c;
}

// Every parameter's bytes and every optimizer state tensor's bytes.
std::vector<std::vector<char>> snapshot(const mt::nn::Module& model, Trainer& t) {
  std::vector<std::vector<char>> out;
  const auto add = [&out](const Tensor& x) {
    const Tensor c = x.detach().contiguous();
    const char* p = static_cast<const char*>(c.data_ptr());
    out.emplace_back(p, p + c.nbytes());
  };
  for (const auto& [name, p] : model.named_parameters()) add(p);
  for (const auto& [key, s] : t.optimizer().state_dict()) add(s);
  return out;
}

// How a micro-batch's loss is poisoned.
enum class Poison {
  loss_nan,       // the loss is NaN, so is every gradient
  one_grad_nan,   // the loss stays finite; one weight's gradient is NaN (0 * d sqrt(x)/dx at x = 0), the rest finite
  grads_inf,      // the loss times 1e300: the gradients overflow to Inf
};

Tensor poisoned(const Tensor& loss, Poison kind, const mt::nn::GPT& gpt) {
  switch (kind) {
    case Poison::loss_nan: return mt::ops::mul(loss, kNaN);
    case Poison::grads_inf: return mt::ops::mul(loss, 1e300);
    case Poison::one_grad_nan: {
      const Tensor w = gpt.named_parameters().front().second;  // the token embedding
      const Tensor zero = mt::ops::sum(mt::ops::sqrt(mt::ops::sub(w, w)));
      return mt::ops::add(loss, mt::ops::mul(zero, 0.0));
    }
  }
  return loss;
}

struct Case {
  std::string precision;
  Poison poison;
  bool layerwise;
};

class NonFiniteStep : public ::testing::TestWithParam<Case> {};

TEST_P(NonFiniteStep, SkipsTheWholeStepAndTrainsOn) {
  const Case& k = GetParam();
  auto model = make_gpt();
  int call = 0;
  // Micro-batch 3 is step 2's first: that step is poisoned, the others are clean.
  mt::train::LossFn loss = [&](const mt::data::Batch& b) {
    const Tensor l = model->loss(b.inputs, b.targets);
    return ++call == 3 ? poisoned(l, k.poison, *model) : l;
  };
  TrainerConfig c = config(k.precision);
  c.layerwise_update = k.layerwise;
  Trainer t(c, model, loss, std::make_shared<TokenDataset>(64, 16, 64));
  EXPECT_FALSE(t.train_step().skipped);
  const auto before = snapshot(*model, t);
  const mt::train::StepMetrics bad = t.train_step();
  EXPECT_TRUE(bad.skipped);
  EXPECT_EQ(bad.to_json().at("skipped"), true);
  if (k.layerwise) {
    // Each parameter stepped as its gradient came: only the poisoned ones stayed (all of them, for a NaN loss).
    if (k.poison == Poison::loss_nan) EXPECT_EQ(snapshot(*model, t), before);
  } else {
    EXPECT_EQ(snapshot(*model, t), before) << "a skipped step must not move any weight or any optimizer state";
  }
  const mt::train::StepMetrics next = t.train_step();
  EXPECT_FALSE(next.skipped);
  EXPECT_TRUE(std::isfinite(next.loss));
  EXPECT_NE(snapshot(*model, t), before);
  EXPECT_EQ(next.to_json().at("skipped"), false);
}

INSTANTIATE_TEST_SUITE_P(
    Trainer, NonFiniteStep,
    ::testing::Values(Case{"fp32", Poison::loss_nan, false}, Case{"fp32", Poison::one_grad_nan, false},
                      Case{"fp32", Poison::grads_inf, false}, Case{"bf16", Poison::loss_nan, false},
                      Case{"bf16", Poison::one_grad_nan, false}, Case{"bf16", Poison::grads_inf, false},
                      Case{"fp32", Poison::loss_nan, true}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const char* poison = info.param.poison == Poison::loss_nan       ? "LossNaN"
                           : info.param.poison == Poison::one_grad_nan ? "OneGradNaN"
                                                                      : "GradsInf";
      return info.param.precision + poison + (info.param.layerwise ? "Layerwise" : "");
    });

std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// From step 4 on every micro-batch is NaN: steps 4, 5, 6 are skipped, and max_bad_steps = 3 stops the run
// there, with the checkpoints of steps 2 and 3 kept and none written after them.
TEST(TrainerFaults, BadStepsInARowStopTheRunKeepingTheLastGoodCheckpoint) {
  TempDir dir;
  auto model = make_gpt();
  int call = 0;
  mt::train::LossFn loss = [&](const mt::data::Batch& b) {
    const Tensor l = model->loss(b.inputs, b.targets);
    return ++call > 6 ? mt::ops::mul(l, kNaN) : l;
  };
  TrainerConfig c = config("fp32");
  c.max_steps = 20;
  c.max_bad_steps = 3;
  c.checkpoint_interval = 1;
  c.keep_checkpoints = 2;
  c.checkpoint_dir = dir.file("ckpt");
  c.metrics_path = dir.file("metrics.jsonl");
  c.summary_path = dir.file("summary.json");
  Trainer t(c, model, loss, std::make_shared<TokenDataset>(64, 16, 64));
  const std::string msg = error_of([&] { t.fit(); });
  EXPECT_NE(msg.find("steps 4 to 6 were all skipped"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ckpt_00000003.safetensors"), std::string::npos) << msg;
  EXPECT_EQ(t.step(), 6);

  EXPECT_EQ(mt::train::latest_checkpoint(c.checkpoint_dir), dir.file("ckpt/ckpt_00000003.safetensors"));
  EXPECT_TRUE(fs::exists(dir.file("ckpt/ckpt_00000002.safetensors")));
  const auto lines = jsonl(c.metrics_path);
  ASSERT_EQ(lines.size(), 6u);
  for (std::size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i].at("skipped"), i >= 3) << "step " << i + 1;
  std::ifstream in(c.summary_path);
  const nlohmann::json summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary.at("steps"), 6);
  EXPECT_EQ(summary.at("skipped_steps"), 3);
  EXPECT_NE(summary.at("stopped").get<std::string>().find("max_bad_steps = 3"), std::string::npos);

  // The kept checkpoint holds step 3's weights, and the run resumes from it.
  auto fresh = make_gpt();
  Trainer resumed(c, fresh, [&](const mt::data::Batch& b) { return fresh->loss(b.inputs, b.targets); },
                  std::make_shared<TokenDataset>(64, 16, 64));
  ASSERT_TRUE(resumed.resume_latest());
  EXPECT_EQ(resumed.step(), 3);
  EXPECT_EQ(snapshot(*fresh, resumed), snapshot(*model, t)) << "skipped steps 4-6 moved nothing";
}

TEST(TrainerFaults, ZeroMaxBadStepsNeverStops) {
  auto model = make_gpt();
  mt::train::LossFn loss = [&](const mt::data::Batch& b) { return mt::ops::mul(model->loss(b.inputs, b.targets), kNaN); };
  TrainerConfig c = config("fp32");
  c.max_bad_steps = 0;
  Trainer t(c, model, loss, std::make_shared<TokenDataset>(64, 16, 64));
  const mt::train::RunSummary s = t.fit();
  EXPECT_EQ(s.steps, 6);
  EXPECT_EQ(s.skipped_steps, 6);
  EXPECT_TRUE(s.stopped.empty());
}

TEST(TrainerFaults, ASaveWithoutRoomNamesTheFileAndTheBytesAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  auto model = make_gpt();
  TrainerConfig c = config("fp32");
  c.checkpoint_dir = dir.file("ckpt");
  Trainer t(c, model, [&](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); },
            std::make_shared<TokenDataset>(64, 16, 64));
  t.train_step();
  const std::string first = t.save_checkpoint();
  const auto first_bytes = fs::file_size(first);
  const auto first_tensors = mt::io::load_safetensors(first);
  t.train_step();
  std::string msg;
  {
    FileSizeLimit limit(first_bytes / 2);
    ASSERT_TRUE(limit.ok());
    msg = error_of([&] { t.save_checkpoint(); });
  }
  EXPECT_NE(msg.find("ckpt_00000002.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bytes free on"), std::string::npos) << msg;
  EXPECT_EQ(mt::train::latest_checkpoint(c.checkpoint_dir), first);
  // Nothing of the failed save is left, and step 1's checkpoint still loads with the same bytes.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(c.checkpoint_dir)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"ckpt_00000001.safetensors"});
  const auto again = mt::io::load_safetensors(first);
  ASSERT_EQ(again.size(), first_tensors.size());
  for (const auto& [name, x] : first_tensors)
    EXPECT_EQ(std::memcmp(again.at(name).data_ptr(), x.data_ptr(), x.nbytes()), 0) << name;
  // With room again the save goes through, and its size is what the error said the file needs.
  const std::string second = t.save_checkpoint();
  EXPECT_EQ(second, dir.file("ckpt/ckpt_00000002.safetensors"));
  EXPECT_NE(msg.find(fmt::format("needs {} bytes", fs::file_size(second))), std::string::npos) << msg;
}

// Run as another user when this process is root (root writes through permission bits), in a child process.
TEST(TrainerFaults, AReadOnlyCheckpointDirectoryIsRefusedBeforeTheFirstStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  const std::string locked = dir.file("locked");
  fs::create_directory(locked);
  ::chmod(locked.c_str(), 0555);
  const auto run = [&] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(2);
    auto model = make_gpt();
    TrainerConfig c = config("fp32");
    c.checkpoint_interval = 1;
    c.checkpoint_dir = locked + "/ckpt";
    int steps = 0;
    Trainer t(c, model, [&](const mt::data::Batch& b) { return ++steps, model->loss(b.inputs, b.targets); },
              std::make_shared<TokenDataset>(64, 16, 64));
    const std::string msg = error_of([&] { t.fit(); });
    std::fprintf(stderr, "%s; %d micro-batches ran\n", msg.c_str(), steps);
    std::_Exit(3);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(3),
              "checkpoint_dir '.*/locked/ckpt' cannot be created: Permission denied; 0 micro-batches ran");
}

}  // namespace
