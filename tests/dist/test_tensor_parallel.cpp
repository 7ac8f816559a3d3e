// Tensor parallelism over dist::world(), run under mpirun at 2, 3 and 4 ranks (one part per rank; alone these
// tests skip, except the refusals). A GPT of 12 heads, split over the ranks, is held to the same GPT built whole
// in the same process (the run alone):
// - each rank's parts are the whole model's values, sliced by Megatron-LM's layout (written out here
//   independently of nn/tensor_shard.h);
// - one forward and backward give the whole model's loss, and each part's gradient is the slice of the whole
//   gradient, to float rounding;
// - 20 steps of training give the whole model's losses within 1e-5 relative (fp32 AdamW; the sums over ranks
//   change the order of additions), also with every block recomputed; with 8-bit AdamW (whose blocks are cut
//   from each part) and under bf16 autocast within 1e-2 and 5e-2 (bf16 runs drift apart by rounding);
// - each rank holds its parameters and AdamW state by formula, and no allocation of a step is as large as the
//   whole wte or the whole logits;
// - at 4 ranks as 2 data x 2 tensor (Communicator::split), the run alone's losses within 1e-5 relative;
// - every rank resumes its own part from its checkpoint on the bits of the run that never stopped.
#include "memtrain/autograd/engine.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/data_parallel.h"
#include "memtrain/dist/tensor_parallel.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/trainer.h"

#include "error_text.h"
#include "resume_runs.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

constexpr std::int64_t kHeads = 12, kWidth = 48, kLayers = 2;

mt::nn::GPTConfig gpt_config(std::int64_t vocab = mt::test_support::kTinyVocab) {
  mt::nn::GPTConfig c;
  c.vocab_size = vocab;
  c.block_size = mt::test_support::kTinyWindow;
  c.n_layer = kLayers;
  c.n_head = kHeads;
  c.n_embd = kWidth;
  return c;
}

// The whole model (comm null) or this rank's part of it, from the same seed.
std::shared_ptr<mt::nn::GPT> make_gpt(const std::shared_ptr<mt::dist::Communicator>& comm,
                                      mt::DType dtype = mt::DType::f32,
                                      std::int64_t vocab = mt::test_support::kTinyVocab) {
  mt::manual_seed(11);
  const mt::nn::TensorShard shard =
      comm ? mt::nn::TensorShard{comm->rank(), comm->size(), mt::dist::tensor_parallel_group(comm)}
           : mt::nn::TensorShard{};
  return std::make_shared<mt::nn::GPT>(gpt_config(vocab), dtype, mt::nn::GPTStage{}, shard);
}

using mt::dist_test::values;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Rank r's part of the whole tensor `whole` ([rows, cols] row-major, or [rows]) named `name`, by Megatron-LM's
// layout: rows (outputs) of c_attn (per q, k, v), c_fc and wte; columns (inputs) of the two c_proj weights.
std::vector<float> part_of(const std::string& name, const std::vector<float>& whole, const mt::Shape& shape, int r,
                           int T) {
  const std::int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
  std::vector<std::pair<std::int64_t, std::int64_t>> keep_rows{{0, rows}};
  std::pair<std::int64_t, std::int64_t> keep_cols{0, cols};
  if (name == "wte.weight") {
    const std::int64_t base = rows / T, extra = rows % T, begin = r * base + std::min<std::int64_t>(r, extra);
    keep_rows = {{begin, begin + base + (r < extra ? 1 : 0)}};
  } else if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {
    const std::int64_t c = rows / 3, each = c / T;
    keep_rows.clear();
    for (int p = 0; p < 3; ++p) keep_rows.push_back({p * c + r * each, p * c + (r + 1) * each});
  } else if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) {
    keep_rows = {{r * rows / T, (r + 1) * rows / T}};
  } else if (ends_with(name, "c_proj.weight")) {
    keep_cols = {r * cols / T, (r + 1) * cols / T};
  }
  std::vector<float> out;
  for (const auto& [a, b] : keep_rows)
    for (std::int64_t i = a; i < b; ++i)
      for (std::int64_t j = keep_cols.first; j < keep_cols.second; ++j) out.push_back(whole[i * cols + j]);
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (const float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

struct RunResult {
  std::vector<double> losses;
  double val_loss = 0.0;
};

struct Case {
  const char* name;
  mt::optim::Spec optimizer;
  mt::amp::Precision precision = mt::amp::Precision::fp32;
  const char* checkpointing = "none";
  double tolerance = 1e-5;  // relative, on each step's loss
};

std::vector<Case> cases() {
  const mt::optim::Spec adamw = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  return {{"adamw", adamw},
          {"adamw, every block recomputed", adamw, mt::amp::Precision::fp32, "every:1"},
          // The 8-bit state is quantised in 256-element blocks of each rank's part, not of the whole tensor: the
          // states differ by the quantisation's error, not by rounding.
          {"adamw8bit", mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1}), mt::amp::Precision::fp32,
           "none", 1e-2},
          // bf16 rounds each part's product before the sum, the run alone rounds the whole product once.
          {"adamw bf16", adamw, mt::amp::Precision::bf16, "none", 5e-2},
          // Loss-scaled: a step is skipped when any rank's parts overflowed.
          {"adamw fp16", adamw, mt::amp::Precision::fp16, "none", 5e-2}};
}

TrainerConfig config_for(const Case& c, std::int64_t tensor_parallel) {
  TrainerConfig config = mt::test_support::short_run_config();
  config.micro_batch = 2;
  config.grad_accum = 2;
  config.max_steps = 20;
  config.grad_clip = 0.5;  // the norm over every rank's parts decides the clip
  config.optimizer = c.optimizer;
  config.precision = c.precision;
  config.activation_checkpointing = mt::ckpt::Policy::parse(c.checkpointing);
  config.data.shuffle = true;
  config.tensor_parallel = tensor_parallel;
  return config;
}

// The whole model alone (comm null), or this rank's part of it over `comm`; beside data parallelism over
// `data_group`.
RunResult train(const TrainerConfig& config, const std::shared_ptr<mt::dist::Communicator>& comm,
                const std::shared_ptr<mt::dist::Communicator>& data_group = nullptr) {
  auto model = make_gpt(comm);
  auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  auto val = std::make_shared<mt::test_support::TokenDataset>(12, mt::test_support::kTinyWindow,
                                                              mt::test_support::kTinyVocab);
  Trainer trainer(config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); },
                  data, val);
  if (data_group) mt::dist::attach_data_parallel(trainer, data_group);
  if (comm) mt::dist::attach_gpt_tensor_parallel(trainer, model, comm);
  RunResult r;
  while (trainer.step() < config.max_steps) r.losses.push_back(trainer.train_step().loss);
  r.val_loss = trainer.evaluate();
  return r;
}

std::string where(const std::shared_ptr<mt::dist::Communicator>& world) {
  return "rank " + std::to_string(world->rank()) + " of " + std::to_string(world->size());
}

}  // namespace

TEST(TensorParallel, EachPartIsTheWholeModelsSlice) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  for (const mt::DType dtype : {mt::DType::f32, mt::DType::bf16}) {
    const auto whole = make_gpt(nullptr, dtype);
    const mt::RngState after_whole = mt::get_rng_state();
    const auto part = make_gpt(world, dtype);
    EXPECT_EQ(mt::get_rng_state(), after_whole) << "the parts must advance the stream as the whole model does";
    std::map<std::string, mt::Tensor> want;
    for (const auto& [name, p] : whole->named_parameters()) want[name] = p;
    std::size_t split = 0;
    for (const auto& [name, p] : part->named_parameters()) {
      ASSERT_EQ(want.count(name), 1u) << name;
      const mt::Tensor& w = want.at(name);
      const std::vector<float> expected = part_of(name, values(w), w.shape(), world->rank(), world->size());
      EXPECT_EQ(values(p), expected) << where(world) << ": " << name << " " << mt::shape_str(p.shape());
      EXPECT_EQ(part->split_by_tensor_parallel(name), p.numel() < w.numel()) << name;
      if (p.numel() < w.numel()) ++split;
    }
    EXPECT_EQ(part->named_parameters().size(), want.size());
    // wte, and in each block c_attn's weight and bias, attn.c_proj's weight, c_fc's weight and bias, and
    // mlp.c_proj's weight.
    EXPECT_EQ(split, 1u + 6u * kLayers);
  }
}

TEST(TensorParallel, OneBackwardGivesTheWholeModelsGradients) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto data = std::make_shared<mt::test_support::TokenDataset>(8, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  mt::data::Batch batch = data->collate({0, 3, 5});
  // One target ignored: both losses skip it.
  batch.targets.data<std::int64_t>()[7] = -100;
  const auto whole = make_gpt(nullptr);
  const auto part = make_gpt(world);
  const mt::Tensor want = whole->loss(batch.inputs, batch.targets);
  const mt::Tensor got = part->loss(batch.inputs, batch.targets);
  EXPECT_NEAR(got.item(), want.item(), 1e-6 * std::fabs(want.item())) << where(world);
  want.backward();
  got.backward();
  std::map<std::string, mt::Tensor> grads;
  for (const auto& [name, p] : whole->named_parameters()) grads[name] = p;
  for (const auto& [name, p] : part->named_parameters()) {
    const mt::Tensor& w = grads.at(name);
    ASSERT_TRUE(p.grad().defined()) << name;
    const std::vector<float> expected = part_of(name, values(w.grad()), w.shape(), world->rank(), world->size());
    const std::vector<float> actual = values(p.grad());
    ASSERT_EQ(actual.size(), expected.size()) << name;
    const double scale = std::max(max_abs(expected), 1e-6);
    for (std::size_t i = 0; i < actual.size(); ++i)
      ASSERT_NEAR(actual[i], expected[i], 2e-5 * scale) << where(world) << ": " << name << "[" << i << "]";
  }
}

TEST(TensorParallel, TrainsAsTheRunAloneForTwentySteps) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  for (const Case& c : cases()) {
    const std::string what = std::string(c.name) + ", " + where(world);
    const RunResult want = train(config_for(c, 1), nullptr);
    const RunResult got = train(config_for(c, world->size()), world);
    ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
    for (std::size_t s = 0; s < got.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], want.losses[s], c.tolerance * std::fabs(want.losses[s]))
          << what << ": step " << s + 1;
    EXPECT_NEAR(got.val_loss, want.val_loss, c.tolerance * std::fabs(want.val_loss)) << what;
    EXPECT_LT(want.losses.back(), 0.8 * want.losses.front()) << what << ": the run did not train";
    // Every rank has the same loss: the sums inside the model give every rank the same bits.
    const std::vector<double> all = world->all_gather_f64({got.losses.back(), got.val_loss});
    for (std::size_t r = 0; r < all.size(); r += 2) {
      EXPECT_EQ(all[r], got.losses.back()) << what << ": rank " << r / 2;
      EXPECT_EQ(all[r + 1], got.val_loss) << what << ": rank " << r / 2;
    }
  }
}

// 4 ranks as 2 data x 2 tensor: each pair of neighbours holds one model split in two, the pairs train on their
// blocks of each step's micro-batches and sum their parts' gradients. The run alone over the same global batch,
// summed in the same canonical order, gives the same losses within 1e-5 relative.
TEST(TensorParallel, TwoDataRanksOfTwoTensorRanksTrainAsTheRunAlone) {
  auto world = mt::dist::world();
  if (world->size() != 4) GTEST_SKIP() << "needs four ranks";
  const mt::dist::DataModelGroups groups = mt::dist::split_data_model(world, 2);
  ASSERT_EQ(groups.model->size(), 2);
  ASSERT_EQ(groups.data->size(), 2);
  EXPECT_EQ(groups.model->rank(), world->rank() % 2);
  EXPECT_EQ(groups.data->rank(), world->rank() / 2);
  // ZeRO 0, and ZeRO-1: each data rank steps its shard of every part's AdamW state.
  for (const std::int64_t zero : {0, 1}) {
    const std::string what = where(world) + ", zero " + std::to_string(zero);
    const Case c = cases().front();
    TrainerConfig alone = config_for(c, 1);
    alone.grad_accum = 4;
    alone.canonical_reduction = true;
    TrainerConfig split = config_for(c, 2);
    split.world_size = 2;
    split.zero = zero;
    const RunResult want = train(alone, nullptr);
    const RunResult got = train(split, groups.model, groups.data);
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (std::size_t s = 0; s < got.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::fabs(want.losses[s])) << what << ": step " << s + 1;
    EXPECT_NEAR(got.val_loss, want.val_loss, 1e-5 * std::fabs(want.val_loss)) << what;
    EXPECT_LT(want.losses.back(), 0.8 * want.losses.front());
    // Every rank of the four has the same loss.
    for (const double l : world->all_gather_f64({got.losses.back()})) EXPECT_EQ(l, got.losses.back()) << what;
  }
  // Refused: ranks that are not a multiple of the tensor-parallel size.
  EXPECT_NE(mt::test_support::error_of([&] { mt::dist::split_data_model(world, 3); })
                .find("4 ranks cannot be split into models of 3 ranks each"),
            std::string::npos);
}

// By formula (docs/memory.md): 4 bytes per parameter element this rank holds, 8 per element for AdamW's state;
// the block's matrices and the vocabulary split T ways. No allocation of a step is as large as the whole wte
// or the whole step's logits, which would exist had anything gathered them.
TEST(TensorParallel, EachRankHoldsItsPartByFormula) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::int64_t T = world->size(), r = world->rank(), V = 4096, C = kWidth, L = kLayers;
  const std::int64_t block_size = mt::test_support::kTinyWindow;
  mt::Allocator& host = mt::Allocator::get(mt::Device::cpu());
  const std::size_t params_before = host.stats()[mt::MemoryCategory::parameters].live_bytes;
  auto model = make_gpt(world, mt::DType::f32, V);
  const std::size_t param_bytes = host.stats()[mt::MemoryCategory::parameters].live_bytes - params_before;
  const std::int64_t vocab_rows = V / T + (r < V % T ? 1 : 0);
  const std::int64_t per_block = 2 * 2 * C                        // ln_1, ln_2
                                 + 3 * C / T * C + 3 * C / T      // c_attn: its heads' q, k, v rows and biases
                                 + C * C / T + C                  // attn.c_proj: their columns, the whole bias
                                 + 4 * C / T * C + 4 * C / T      // c_fc: its units
                                 + C * 4 * C / T + C;             // mlp.c_proj: their columns, the whole bias
  const std::int64_t held = vocab_rows * C + block_size * C + L * per_block + 2 * C;
  EXPECT_EQ(param_bytes, static_cast<std::size_t>(4 * held)) << where(world);

  TrainerConfig config = config_for(cases().front(), T);
  config.micro_batch = 4;
  config.grad_accum = 1;
  config.max_steps = 3;  // two steps watched, the third by fit()
  auto data = std::make_shared<mt::test_support::TokenDataset>(16, block_size, V);
  Trainer trainer(config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); },
                  data);
  mt::dist::attach_gpt_tensor_parallel(trainer, model, world);
  // The largest single allocation of a step: the largest rise of the live bytes between two allocator events.
  std::size_t previous = host.stats().live_bytes, largest = 0;
  host.set_observer([&](const std::array<std::size_t, mt::kNumMemoryCategories>& live) {
    std::size_t now = 0;
    for (const std::size_t b : live) now += b;
    if (now > previous) largest = std::max(largest, now - previous);
    previous = now;
  });
  trainer.train_step();
  trainer.train_step();
  host.set_observer(nullptr);
  EXPECT_EQ(trainer.optimizer().state_bytes(), static_cast<std::size_t>(8 * held)) << where(world);
  const std::size_t whole_wte = 4 * V * C, whole_logits = 4 * config.micro_batch * block_size * V;
  EXPECT_GT(largest, 0u);
  EXPECT_LT(largest, std::min(whole_wte, whole_logits)) << where(world) << ": an allocation of " << largest << " B";
  // The run summary has every rank's own figures, rank by rank.
  const std::vector<std::int64_t> all_held = world->all_gather_i64({held});
  const mt::train::RunSummary summary = trainer.fit();
  ASSERT_EQ(summary.ranks.size(), static_cast<std::size_t>(T));
  for (std::size_t q = 0; q < summary.ranks.size(); ++q) {
    EXPECT_EQ(summary.ranks[q]["peak_bytes_by_category"]["parameters"].get<std::int64_t>(), 4 * all_held[q]);
    EXPECT_EQ(summary.ranks[q]["optimizer_state_bytes"].get<std::int64_t>(), 8 * all_held[q]);
  }
  // What the rank holds is about 1/T of the whole model's blocks and vocabulary.
  const std::int64_t whole_block = 2 * 2 * C + 12 * C * C + 9 * C + 4 * C;
  EXPECT_LT(per_block, whole_block / T + 6 * C) << where(world);
}

TEST(TensorParallel, RefusesWhatItCannotSplit) {
  auto world = mt::dist::world();
  const auto message = [](const std::function<void()>& f) { return mt::test_support::error_of(f); };
  // 12 heads over 5 ranks, and a split without its group: refused while building.
  const auto five = mt::dist::tensor_parallel_group(mt::dist::simulated_group(0, 5));
  EXPECT_NE(message([&] { mt::nn::GPT(gpt_config(), mt::DType::f32, {}, mt::nn::TensorShard{0, 5, five}); })
                .find("n_head 12 is not a multiple of the 5 tensor-parallel ranks"),
            std::string::npos);
  EXPECT_NE(message([&] { mt::nn::GPT(gpt_config(), mt::DType::f32, {}, mt::nn::TensorShard{0, 2, nullptr}); })
                .find("needs its group"),
            std::string::npos);
  // Options the split does not compose with yet, each named.
  TrainerConfig config = mt::test_support::short_run_config();
  config.tensor_parallel = 2;
  config.galore_rank = 4;
  EXPECT_NE(message([&] { config.validate(); }).find("tensor_parallel 2 with galore_rank 4"), std::string::npos);
  config.galore_rank = 0;
  config.pipeline_stages = 2;
  config.grad_accum = 2;
  EXPECT_NE(message([&] { config.validate(); }).find("with pipeline_stages 2: not built yet"), std::string::npos);
  config.pipeline_stages = 1;
  config.world_size = 2;  // beside data parallelism: ZeRO-1 at most
  config.zero = 1;
  config.validate();
  config.zero = 2;
  EXPECT_NE(message([&] { config.validate(); }).find("tensor_parallel 2 with zero 2: not built yet"),
            std::string::npos);
  // The config says 3 ranks, the group has another number.
  if (world->size() >= 2) {
    config = config_for(cases().front(), 3 == world->size() ? 2 : 3);
    auto model = make_gpt(world);
    auto data = std::make_shared<mt::test_support::TokenDataset>(8, mt::test_support::kTinyWindow,
                                                                 mt::test_support::kTinyVocab);
    Trainer trainer(config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); },
                    data);
    EXPECT_NE(message([&] { mt::dist::attach_gpt_tensor_parallel(trainer, model, world); })
                  .find("but the group has " + std::to_string(world->size()) + " ranks"),
              std::string::npos);
    // Without the group attached, a step is refused rather than run as if alone.
    EXPECT_NE(message([&] { trainer.train_step(); }).find("no group is attached"), std::string::npos);
  }
}

// Every rank writes its own part to its own directory (fp16: the loss scaler's state too); a run resumed from
// them continues on the bits of the run that never stopped; a rank's file is refused by the whole model alone.
TEST(TensorParallel, EachRankResumesItsOwnPartOnTheSameBits) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::string dir = world->broadcast_string(
      (std::filesystem::temp_directory_path() / ("memtrain_tp_" + std::to_string(::getpid()))).string(), 0);
  TrainerConfig config = config_for(cases().back(), world->size());  // AdamW fp16
  config.checkpoint_dir = dir;
  config.max_steps = 6;
  const auto make = [&] {
    auto model = make_gpt(world);
    auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                                 mt::test_support::kTinyVocab);
    auto trainer = std::make_unique<Trainer>(
        config, model, [model](const mt::data::Batch& b) { return model->loss(b.inputs, b.targets); }, data);
    mt::dist::attach_gpt_tensor_parallel(*trainer, model, world);
    return std::pair(model, std::move(trainer));
  };
  const mt::dist_test::ResumeRuns runs = mt::dist_test::run_and_resume(make);
  EXPECT_NE(runs.saved.find("tensor" + std::to_string(world->rank()) + "-of-"), std::string::npos) << runs.saved;
  ASSERT_EQ(runs.resumed_at, 3);
  EXPECT_EQ(runs.resumed, runs.went_on) << where(world);
  EXPECT_EQ(runs.resumed_weights, runs.went_on_weights) << where(world);

  // The whole model alone cannot take a rank's part.
  TrainerConfig alone = config;
  alone.tensor_parallel = 1;
  auto whole = make_gpt(nullptr);
  auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  Trainer refused(alone, whole, [whole](const mt::data::Batch& b) { return whole->loss(b.inputs, b.targets); }, data);
  const std::string part_file = (std::filesystem::path(dir) /
                                 ("tensor" + std::to_string(world->rank()) + "-of-" + std::to_string(world->size())) /
                                 "ckpt_00000003.safetensors")
                                    .string();
  const std::string text = mt::test_support::error_of([&] { refused.load_checkpoint(part_file); });
  EXPECT_NE(text.find("resumes the tensor-parallel layout it was written with"), std::string::npos) << text;
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}
