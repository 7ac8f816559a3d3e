// Pipeline parallelism over dist::world(), run under mpirun at 2, 3 and 4 ranks (one stage per rank; alone
// there is no pipeline and these tests skip): a 4-block GPT trained for 8 steps of 8 micro-batches through the
// stages gives, on every stage, the losses, the val loss and the weights of the whole model trained by one rank
// with the canonical reduction, bit for bit: AdamW, 8-bit AdamW and 8-bit GaLore in fp32, AdamW in bf16, fp16 and
// fp8 (delayed scaling), and with every other block recomputed, under the 1F1B and the GPipe order. The tied wte
// is trained on the last stage and the first stage's copy follows it. Under 1F1B the first stages keep fewer
// activations than under GPipe's order; each stage holds its parameters and AdamW state by formula.
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/data_parallel.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/dist/pipeline.h"
#include "memtrain/train/trainer.h"

#include "error_text.h"
#include "resume_runs.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

constexpr std::int64_t kMicroBatches = 8;

std::shared_ptr<mt::nn::GPT> make_gpt(mt::nn::GPTStage stage) {
  mt::manual_seed(11);
  mt::nn::GPTConfig c;
  c.vocab_size = mt::test_support::kTinyVocab;
  c.block_size = mt::test_support::kTinyWindow;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 32;
  return std::make_shared<mt::nn::GPT>(c, mt::DType::f32, stage);
}

struct RunResult {
  std::vector<double> losses;
  double val_loss = 0.0;
  std::map<std::string, std::vector<float>> weights;
  std::size_t activations_peak = 0;
};

using mt::dist_test::values;

struct Case {
  const char* name;
  mt::optim::Spec optimizer;
  std::int64_t galore_rank = 0;
  mt::amp::Precision precision = mt::amp::Precision::fp32;
  const char* checkpointing = "none";
};

std::vector<Case> cases() {
  const mt::optim::Spec adamw = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  return {{"adamw", adamw},
          {"adamw8bit", mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1})},
          {"galore 8-bit", mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1}), 4},
          {"adamw bf16", adamw, 0, mt::amp::Precision::bf16},
          {"adamw fp16", adamw, 0, mt::amp::Precision::fp16},
          // Delayed scaling: each stage keeps the amax histories of its own linears.
          {"adamw fp8", adamw, 0, mt::amp::Precision::fp8},
          // Recomputed within a stage.
          {"adamw checkpoint every:2", adamw, 0, mt::amp::Precision::fp32, "every:2"}};
}

TrainerConfig config_for(const Case& c, std::int64_t stages, const std::string& schedule) {
  TrainerConfig config = mt::test_support::short_run_config();
  config.micro_batch = 2;
  config.grad_accum = kMicroBatches;
  config.max_steps = 8;
  config.grad_clip = 0.5;  // the global norm over every stage's gradients decides the clip
  config.optimizer = c.optimizer;
  config.galore_rank = c.galore_rank;
  config.galore_update_gap = 3;
  config.precision = c.precision;
  config.fp8_scaling = mt::amp::Fp8ScalingKind::delayed;
  config.activation_checkpointing = mt::ckpt::Policy::parse(c.checkpointing);
  config.data.shuffle = true;
  config.canonical_reduction = true;
  config.pipeline_stages = stages;
  config.pipeline_schedule = schedule;
  return config;
}

// Trains the whole model (comm null) or this rank's stage of it over `comm`; beside data parallelism over
// `data_group`.
RunResult train(const TrainerConfig& config, const std::shared_ptr<mt::dist::Communicator>& comm,
                const std::shared_ptr<mt::dist::Communicator>& data_group = nullptr) {
  const mt::nn::GPTStage stage = comm ? mt::nn::GPTStage{comm->rank(), comm->size()} : mt::nn::GPTStage{};
  auto model = make_gpt(stage);
  auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  auto val = std::make_shared<mt::test_support::TokenDataset>(12, mt::test_support::kTinyWindow,
                                                              mt::test_support::kTinyVocab);
  auto loss = [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); };
  Trainer trainer(config, model, loss, data, val);
  if (data_group) mt::dist::attach_data_parallel(trainer, data_group);
  if (comm) mt::dist::attach_gpt_pipeline(trainer, model, comm);
  mt::Allocator::get(mt::Device::cpu()).reset_peak();
  RunResult r;
  while (trainer.step() < config.max_steps) r.losses.push_back(trainer.train_step().loss);
  r.activations_peak = mt::Allocator::get(mt::Device::cpu()).stats()[mt::MemoryCategory::activations].peak_bytes;
  r.val_loss = trainer.evaluate();
  for (const auto& [name, p] : model->named_parameters()) r.weights[name] = values(p);
  return r;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST(Pipeline, EveryStageHasTheBitsOfOneRank) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  for (const char* schedule : {"1f1b", "gpipe"}) {
    for (const Case& c : cases()) {
      const std::string what = std::string(c.name) + ", " + schedule + ", stage " + std::to_string(world->rank()) +
                               " of " + std::to_string(world->size());
      const RunResult want = train(config_for(c, 1, schedule), nullptr);
      const RunResult got = train(config_for(c, world->size(), schedule), world);
      ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
      for (std::size_t s = 0; s < got.losses.size(); ++s)
        EXPECT_TRUE(same_bits(got.losses[s], want.losses[s]))
            << what << ": loss of step " << s + 1 << " is " << got.losses[s] << ", one rank " << want.losses[s];
      EXPECT_TRUE(same_bits(got.val_loss, want.val_loss)) << what << ": val " << got.val_loss << " vs "
                                                          << want.val_loss;
      // The stage holds part of the model, and each of its tensors (the first stage's wte copy too) is the
      // whole model's.
      EXPECT_LT(got.weights.size(), want.weights.size()) << what;
      for (const auto& [name, w] : got.weights) {
        ASSERT_EQ(want.weights.count(name), 1u) << what << ": " << name;
        const std::vector<float>& v = want.weights.at(name);
        ASSERT_EQ(w.size(), v.size()) << what << ": " << name;
        EXPECT_EQ(std::memcmp(w.data(), v.data(), w.size() * sizeof(float)), 0) << what << ": " << name;
      }
      EXPECT_NE(want.losses.front(), want.losses.back()) << what << ": the run did not train";
    }
  }
}

// 4 ranks as 2 data x 2 stages: each pair of neighbours is one pipeline, the pairs train on their blocks of each
// step's micro-batches and sum each stage's gradients over the data group in the canonical tree. The bits of
// the run alone with the canonical reduction over the same global batch, on every rank.
TEST(Pipeline, TwoDataRanksOfTwoStagesHaveTheBitsOfOneRank) {
  auto world = mt::dist::world();
  if (world->size() != 4) GTEST_SKIP() << "needs four ranks";
  const mt::dist::DataModelGroups groups = mt::dist::split_data_model(world, 2);
  // AdamW in fp32 and in bf16; 8-bit AdamW with its state sharded over the data ranks (ZeRO-1).
  for (const auto& [c, zero] : {std::pair(cases()[0], 0), std::pair(cases()[3], 0), std::pair(cases()[1], 1)}) {
    const std::string what = std::string(c.name) + ", zero " + std::to_string(zero) + ", rank " +
                             std::to_string(world->rank());
    TrainerConfig alone = config_for(c, 1, "1f1b");
    TrainerConfig split = config_for(c, 2, "1f1b");
    split.world_size = 2;
    split.zero = zero;
    split.grad_accum = kMicroBatches / 2;  // the same global batch of 8 micro-batches
    const RunResult want = train(alone, nullptr);
    const RunResult got = train(split, groups.model, groups.data);
    ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
    for (std::size_t s = 0; s < got.losses.size(); ++s)
      EXPECT_TRUE(same_bits(got.losses[s], want.losses[s]))
          << what << ": loss of step " << s + 1 << " is " << got.losses[s] << ", one rank " << want.losses[s];
    EXPECT_TRUE(same_bits(got.val_loss, want.val_loss)) << what;
    for (const auto& [name, w] : got.weights) {
      const std::vector<float>& v = want.weights.at(name);
      ASSERT_EQ(w.size(), v.size()) << what << ": " << name;
      EXPECT_EQ(std::memcmp(w.data(), v.data(), w.size() * sizeof(float)), 0) << what << ": " << name;
    }
  }
}

// 2 data x 2 stages under ZeRO-1: the data rank 0 of each stage writes the stage's file, every rank its state
// shard, into the stage's directory; a run resumed from them continues on the bits of the run that never stopped.
TEST(Pipeline, TwoDataRanksOfTwoStagesResumeTheirShardsOnTheSameBits) {
  auto world = mt::dist::world();
  if (world->size() != 4) GTEST_SKIP() << "needs four ranks";
  const mt::dist::DataModelGroups groups = mt::dist::split_data_model(world, 2);
  const std::string dir = world->broadcast_string(
      (std::filesystem::temp_directory_path() / ("memtrain_dp_pp_" + std::to_string(::getpid()))).string(), 0);
  TrainerConfig config = config_for(cases()[1], 2, "1f1b");  // 8-bit AdamW
  config.world_size = 2;
  config.zero = 1;
  config.grad_accum = kMicroBatches / 2;
  config.checkpoint_dir = dir;
  config.max_steps = 6;
  const auto make = [&] {
    auto model = make_gpt({groups.model->rank(), groups.model->size()});
    auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                                 mt::test_support::kTinyVocab);
    auto trainer = std::make_unique<Trainer>(
        config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); }, data);
    mt::dist::attach_data_parallel(*trainer, groups.data);
    mt::dist::attach_gpt_pipeline(*trainer, model, groups.model);
    return std::pair(model, std::move(trainer));
  };
  const mt::dist_test::ResumeRuns runs = mt::dist_test::run_and_resume(make);
  const std::filesystem::path stage_dir =
      std::filesystem::path(dir) / ("stage" + std::to_string(groups.model->rank()) + "-of-2");
  EXPECT_TRUE(std::filesystem::exists(stage_dir / "ckpt_00000003.safetensors")) << stage_dir;
  EXPECT_TRUE(std::filesystem::exists(stage_dir / ("ckpt_00000003.safetensors.rank" +
                                                   std::to_string(groups.data->rank()) + "of2")));
  ASSERT_EQ(runs.resumed_at, 3);
  for (std::size_t s = 0; s < runs.went_on.size(); ++s)
    EXPECT_TRUE(same_bits(runs.resumed[s], runs.went_on[s])) << "step " << s + 4 << ": " << runs.resumed[s];
  EXPECT_EQ(runs.resumed_weights, runs.went_on_weights) << "rank " << world->rank();
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

// 1F1B keeps at most P - stage micro-batches in flight; GPipe's order keeps all 8 on every stage.
TEST(Pipeline, OneForwardOneBackwardKeepsFewerActivationsThanGPipe) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const Case adamw = cases().front();
  const RunResult one_f_one_b = train(config_for(adamw, world->size(), "1f1b"), world);
  const RunResult gpipe = train(config_for(adamw, world->size(), "gpipe"), world);
  if (world->rank() + 1 < world->size()) {
    // In flight under 1F1B: P - stage of 8 micro-batches (the received inputs and block activations scale alike).
    const double bound = static_cast<double>(world->size() - world->rank()) / kMicroBatches;
    EXPECT_LT(static_cast<double>(one_f_one_b.activations_peak),
              (bound + 0.125) * static_cast<double>(gpipe.activations_peak))
        << "stage " << world->rank() << ": 1f1b " << one_f_one_b.activations_peak << " B, gpipe "
        << gpipe.activations_peak << " B";
  }
}

// By formula (docs/memory.md): a stage's parameters are 4 bytes per element of the tensors it holds (the first
// stage's wte copy included), its AdamW state 8 bytes per element it trains; the stages together train the
// whole model once.
TEST(Pipeline, EachStageHoldsItsShareByFormula) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const TrainerConfig config = config_for(cases().front(), world->size(), "1f1b");
  mt::Allocator& host = mt::Allocator::get(mt::Device::cpu());
  const std::size_t params_before = host.stats()[mt::MemoryCategory::parameters].live_bytes;
  auto model = make_gpt({world->rank(), world->size()});
  const std::size_t param_bytes = host.stats()[mt::MemoryCategory::parameters].live_bytes - params_before;
  auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  Trainer trainer(config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); },
                  data);
  mt::dist::attach_gpt_pipeline(trainer, model, world);
  trainer.train_step();
  std::int64_t held = 0, trained = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    held += p.numel();
    if (p.requires_grad()) trained += p.numel();
  }
  EXPECT_EQ(param_bytes, static_cast<std::size_t>(4 * held));
  EXPECT_EQ(trainer.optimizer().state_bytes(), static_cast<std::size_t>(8 * trained));
  std::int64_t whole = 0;
  for (const auto& [name, p] : make_gpt({})->named_parameters()) whole += p.numel();
  const std::vector<std::int64_t> all = world->all_gather_i64({trained, held});
  std::int64_t trained_sum = 0;
  for (std::size_t r = 0; r < all.size(); r += 2) trained_sum += all[r];
  EXPECT_EQ(trained_sum, whole) << "every parameter is trained by exactly one stage";
  EXPECT_LT(held, whole) << "stage " << world->rank() << " holds the whole model";
}

// Every stage writes its own checkpoint (fp16: the loss scaler's state too); a run resumed from them continues on
// the bits of the run that never stopped; a stage's file is refused by a trainer of another layout.
TEST(Pipeline, StagesResumeFromTheirOwnCheckpointsOnTheSameBits) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::string dir = world->broadcast_string(
      (std::filesystem::temp_directory_path() / ("memtrain_pp_" + std::to_string(::getpid()))).string(), 0);
  TrainerConfig config = config_for(cases()[4], world->size(), "1f1b");  // AdamW fp16
  config.checkpoint_dir = dir;
  config.max_steps = 6;
  const auto make = [&] {
    auto model = make_gpt({world->rank(), world->size()});
    auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                                 mt::test_support::kTinyVocab);
    auto trainer = std::make_unique<Trainer>(
        config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); }, data);
    mt::dist::attach_gpt_pipeline(*trainer, model, world);
    return std::pair(model, std::move(trainer));
  };
  const mt::dist_test::ResumeRuns runs = mt::dist_test::run_and_resume(make);
  EXPECT_NE(runs.saved.find("stage" + std::to_string(world->rank()) + "-of-"), std::string::npos) << runs.saved;
  ASSERT_EQ(runs.resumed_at, 3);
  for (std::size_t s = 0; s < runs.went_on.size(); ++s)
    EXPECT_TRUE(same_bits(runs.resumed[s], runs.went_on[s])) << "step " << s + 4 << ": " << runs.resumed[s];
  EXPECT_EQ(runs.resumed_weights, runs.went_on_weights) << "stage " << world->rank();

  // The whole model alone cannot take a stage's part.
  TrainerConfig alone = config;
  alone.pipeline_stages = 1;
  auto whole = make_gpt({});
  auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  Trainer refused(alone, whole, [whole](const mt::data::Batch& b) { return whole->loss(b.inputs, b.targets); }, data);
  const std::string stage_file = (std::filesystem::path(dir) /
                                  ("stage" + std::to_string(world->rank()) + "-of-" + std::to_string(world->size())) /
                                  "ckpt_00000003.safetensors")
                                     .string();
  const std::string text = mt::test_support::error_of([&] { refused.load_checkpoint(stage_file); });
  EXPECT_NE(text.find("resumes the pipeline layout it was written with"), std::string::npos) << text;
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

TEST(Pipeline, RefusesAStageCountThatIsNotTheLaunchers) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  TrainerConfig config = config_for(cases().front(), world->size() + 1, "1f1b");
  config.grad_accum = world->size() + 1;
  auto model = make_gpt({world->rank(), world->size()});
  auto data = std::make_shared<mt::test_support::TokenDataset>(16, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  Trainer trainer(config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); },
                  data);
  const std::string text = mt::test_support::error_of([&] { mt::dist::attach_gpt_pipeline(trainer, model, world); });
  EXPECT_NE(text.find("pipeline_stages is " + std::to_string(world->size() + 1)), std::string::npos) << text;
}
