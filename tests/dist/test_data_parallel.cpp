// Data parallel training over dist::world(), run by ctest alone and under mpirun at 2, 3 and 4 ranks: the tiny
// GPT trained for 20 steps on a global batch of 8 micro-batches (6 at 3 ranks) gives the same losses and
// weights, bit for bit, as the same global batch trained alone with the canonical reduction: AdamW, 8-bit
// AdamW and 8-bit GaLore, AdamW in fp16, bf16 and fp8 (delayed and blockwise scaling), small buckets started
// during the backward, and ZeRO-1/2 (each rank's optimizer state by formula; 8-bit GaLore at ZeRO-1).
// Checkpoints written at N ranks resume alone or sharded on the same bits; each rank's memory is its own
// prediction to the byte; a config that differs between ranks is refused naming the field; a world size that
// does not match the launcher's is refused.
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/state_arena.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/data_parallel.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/optim/galore.h"
#include "memtrain/train/predict.h"
#include "memtrain/train/trainer.h"

#include "error_text.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

// The global batch: 8 micro-batches (6 at 3 ranks, whose blocks must be equal powers of two), so every world
// size but 8 sums a block of several micro-batches locally before the ranks' tree.
std::int64_t per_rank(std::int64_t ranks) { return std::max<std::int64_t>(1, 8 / ranks); }

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
};

std::vector<float> values(const mt::Tensor& t) {
  const mt::Tensor c = t.detach().to(mt::DType::f32).contiguous();
  return {c.data<float>(), c.data<float>() + c.numel()};
}

// `ranks` ranks of the run with `world` ranks (1: the same global batch trained alone).
TrainerConfig config_for(const mt::optim::Spec& optimizer, std::int64_t galore_rank, std::int64_t ranks,
                         std::int64_t world) {
  TrainerConfig c = mt::test_support::short_run_config();
  c.micro_batch = 2;
  c.max_steps = 20;
  c.grad_clip = 1.0;  // the global norm: the same on every rank only if the gradients are
  c.optimizer = optimizer;
  c.galore_rank = galore_rank;
  c.galore_update_gap = 5;
  c.data.shuffle = true;
  c.world_size = ranks;
  c.grad_accum = per_rank(world) * world / ranks;
  c.canonical_reduction = true;
  return c;
}

struct Fixture {
  std::shared_ptr<mt::nn::Module> model;
  std::unique_ptr<Trainer> trainer;
  std::shared_ptr<mt::dist::DataParallel> dp;  // null alone
};

Fixture make(const TrainerConfig& c, const std::shared_ptr<mt::dist::Communicator>& comm,
             mt::dist::DataParallelOptions options = {}) {
  mt::manual_seed(11);
  Fixture f;
  f.model = mt::test_support::make_tiny_lm(false);
  auto data = std::make_shared<mt::test_support::TokenDataset>(48, mt::test_support::kTinyWindow,
                                                               mt::test_support::kTinyVocab);
  f.trainer = std::make_unique<Trainer>(c, f.model, mt::test_support::tiny_lm_loss(f.model, false), data);
  f.dp = mt::dist::attach_data_parallel(*f.trainer, comm, options);
  return f;
}

RunResult finish(Fixture& f, std::vector<double> losses = {}) {
  while (f.trainer->step() < f.trainer->config().max_steps) losses.push_back(f.trainer->train_step().loss);
  RunResult r{std::move(losses), {}};
  for (const auto& [name, p] : f.model->named_parameters()) r.weights.push_back(values(p));
  return r;
}

void expect_same_bits(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    EXPECT_EQ(std::memcmp(&got.losses[s], &want.losses[s], sizeof(double)), 0)
        << what << ": loss of step " << s + 1 << " is " << got.losses[s] << ", alone " << want.losses[s];
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  for (std::size_t i = 0; i < got.weights.size(); ++i)
    EXPECT_EQ(std::memcmp(got.weights[i].data(), want.weights[i].data(), got.weights[i].size() * sizeof(float)), 0)
        << what << ": parameter " << i << " differs from the run alone";
}

struct Case {
  const char* name;
  mt::optim::Spec optimizer;
  std::int64_t galore_rank;
  mt::amp::Precision precision = mt::amp::Precision::fp32;
  mt::amp::Fp8ScalingKind fp8_scaling = mt::amp::Fp8ScalingKind::blockwise;
};

std::vector<Case> cases() {
  const mt::optim::Spec adamw = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  return {{"adamw", adamw, 0},
          {"adamw8bit", mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1}), 0},
          {"galore 8-bit", mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1}), 4},
          // The loss scaler decides from the summed gradients: the same on every rank.
          {"adamw fp16", adamw, 0, mt::amp::Precision::fp16},
          {"adamw bf16", adamw, 0, mt::amp::Precision::bf16},
          // Delayed scaling: the ranks merge each step's amaxes, so the scales follow the whole global batch.
          {"adamw fp8 delayed", adamw, 0, mt::amp::Precision::fp8, mt::amp::Fp8ScalingKind::delayed},
          {"adamw fp8 blockwise", adamw, 0, mt::amp::Precision::fp8, mt::amp::Fp8ScalingKind::blockwise}};
}

TrainerConfig config_for(const Case& c, std::int64_t ranks, std::int64_t world) {
  TrainerConfig config = config_for(c.optimizer, c.galore_rank, ranks, world);
  config.precision = c.precision;
  config.fp8_scaling = c.fp8_scaling;
  return config;
}

}  // namespace

TEST(DataParallel, SameBitsAsTheRunAloneAtAnyWorldSize) {
  auto world = mt::dist::world();
  for (const Case& c : cases()) {
    Fixture alone = make(config_for(c, 1, world->size()), mt::dist::single_process());
    const RunResult want = finish(alone);
    Fixture dp = make(config_for(c, world->size(), world->size()), world);
    expect_same_bits(finish(dp), want, std::string(c.name) + " at " + std::to_string(world->size()) + " ranks");
    // The weights moved: a test of equal bits between runs that never trained would prove nothing.
    EXPECT_NE(want.losses.front(), want.losses.back()) << c.name;
  }
}

// Buckets of a few KiB: most of them are handed to the sums from the gradient-ready hooks, while the backward
// still runs, in whatever order the hooks fire; the bits stay those of the run alone.
TEST(DataParallel, SmallBucketsStartDuringTheBackwardAndKeepTheBits) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const mt::optim::Spec adamw = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  Fixture alone = make(config_for(adamw, 0, 1, world->size()), mt::dist::single_process());
  const RunResult want = finish(alone);
  Fixture dp = make(config_for(adamw, 0, world->size(), world->size()), world,
                    {.first_bucket_bytes = 1024, .bucket_bytes = 4096});
  expect_same_bits(finish(dp), want, "small buckets");
  const mt::dist::DataParallelStats stats = dp.dp->stats();
  EXPECT_EQ(stats.steps, 20);
  EXPECT_GT(stats.buckets, 20 * 10) << stats.describe();  // 110 KiB of gradients a step, in buckets of 4 KiB
  EXPECT_GT(stats.early_buckets, stats.buckets / 2) << stats.describe();
}

TEST(DataParallel, ACheckpointWrittenAtNRanksResumesAloneOnTheSameBits) {
  auto world = mt::dist::world();
  const mt::optim::Spec adamw = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  Fixture alone = make(config_for(adamw, 0, 1, world->size()), mt::dist::single_process());
  const RunResult want = finish(alone);

  // One directory for every rank: rank 0's name.
  const std::string dir = world->broadcast_string(
      (std::filesystem::temp_directory_path() / ("memtrain_dp_" + std::to_string(::getpid()))).string(), 0);
  const std::string path = dir + "/half.safetensors";
  {
    Fixture dp = make(config_for(adamw, 0, world->size(), world->size()), world);
    std::vector<double> losses;
    for (int s = 0; s < 10; ++s) losses.push_back(dp.trainer->train_step().loss);
    if (world->rank() == 0) {
      std::filesystem::create_directories(dir);
      dp.trainer->save_checkpoint(path);
    }
    world->barrier();
  }
  Fixture resumed = make(config_for(adamw, 0, 1, world->size()), mt::dist::single_process());
  testing::internal::CaptureStderr();
  resumed.trainer->load_checkpoint(path);
  const std::string warnings = testing::internal::GetCapturedStderr();
  // The same global batch split another way: the data order is the same, so nothing to warn about.
  EXPECT_EQ(warnings.find("data order differs"), std::string::npos) << warnings;
  EXPECT_EQ(resumed.trainer->step(), 10);
  const std::vector<double> first_half(want.losses.begin(), want.losses.begin() + 10);
  expect_same_bits(finish(resumed, first_half), want, "resumed alone");
  world->barrier();  // everyone has read the file
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

// The optimizer state one rank keeps under ZeRO-1, by docs/memory.md's formulas applied to its shard of each
// parameter (dist::shard_bounds: boundaries on 256-element blocks); 8-bit or not by the whole tensor's size.
// With GaLore, a projected weight's state is that of its shard of the projected gradient R (r x n when m <= n,
// else m x r), plus the whole basis (min(m, n) x r floats) that every rank keeps.
std::size_t zero1_state_bytes(const mt::nn::Module& model, bool eight_bit, std::int64_t galore_rank, int rank,
                              int ranks) {
  std::size_t bytes = 0;
  const auto shard_bytes = [&](std::int64_t numel) {
    const std::vector<std::int64_t> b = mt::dist::shard_bounds(numel, ranks, 256);
    const auto n = static_cast<std::size_t>(b[static_cast<std::size_t>(rank) + 1] - b[static_cast<std::size_t>(rank)]);
    return eight_bit && numel >= 4096 ? 2 * n + 8 * ((n + 255) / 256) : 8 * n;
  };
  for (const auto& [name, p] : model.named_parameters()) {
    if (galore_rank == 0 || !mt::optim::is_galore_target(name, p)) {
      bytes += shard_bytes(p.numel());
      continue;
    }
    const std::int64_t m = p.size(0), n = p.size(1);
    bytes += shard_bytes(galore_rank * (m <= n ? n : m)) + 4 * static_cast<std::size_t>(std::min(m, n) * galore_rank);
  }
  return bytes;
}

// ZeRO-1: each rank steps its shard of every parameter with state for that shard alone, then the ranks
// exchange the stepped shards; with GaLore every rank projects the whole gradient of a projected weight and
// steps its shard of R, the ranks exchange the projected update and each adds it to its whole weight. ZeRO-2:
// the ranks also keep only their shards of the summed gradients (a reduce-scatter per bucket) and clip by a
// norm combined from every rank's blocks. The bits stay those of the run alone (clipping active: grad_clip 1),
// and each rank's state is its shards' by the formulas (a shard of a tensor of >= 4096 elements is 8-bit
// however small it is). With GaLore at ZeRO-2 a projected weight's gradient is summed whole, as at ZeRO-1.
TEST(DataParallel, ZeroShardsTheStateAndKeepsTheBits) {
  auto world = mt::dist::world();
  struct Optimizer {
    mt::optim::Spec spec;
    bool eight_bit;
    std::int64_t galore_rank;
    mt::amp::Precision precision = mt::amp::Precision::fp32;
  };
  const std::vector<Optimizer> optimizers = {
      {mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}), false, 0},
      {mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1}), true, 0},
      {mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1}), true, 4},
      // Under ZeRO-2 each rank unscales only its shards; the ranks agree on skipping a step that overflowed.
      {mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}), false, 0, mt::amp::Precision::fp16}};
  for (const std::int64_t stage : {1, 2})
  for (const auto& [spec, eight_bit, galore_rank, precision] : optimizers) {
    TrainerConfig one = config_for(spec, galore_rank, 1, world->size());
    one.precision = precision;
    one.loss_scaler.init_scale = 1 << 24;  // fp16: the first steps overflow and are skipped
    Fixture alone = make(one, mt::dist::single_process());
    const RunResult want = finish(alone);
    const auto& steps = alone.trainer->history();
    EXPECT_TRUE(std::any_of(steps.begin(), steps.end(), [](const auto& m) { return !m.skipped && m.grad_norm > 1.0; }))
        << "the test is about runs that clip";
    if (precision == mt::amp::Precision::fp16)
      EXPECT_TRUE(alone.trainer->history().front().skipped) << "the test is about a step that overflows";
    TrainerConfig c = config_for(spec, galore_rank, world->size(), world->size());
    c.zero = stage;
    c.precision = precision;
    c.loss_scaler = one.loss_scaler;
    Fixture dp = make(c, world);
    const std::string what = spec.to_string() + (galore_rank > 0 ? " galore" : "") +
                             (precision == mt::amp::Precision::fp16 ? " fp16" : "") + " zero " +
                             std::to_string(stage) + " at " + std::to_string(world->size());
    expect_same_bits(finish(dp), want, what);
    EXPECT_EQ(dp.trainer->optimizer().state_bytes(),
              zero1_state_bytes(*dp.model, eight_bit, galore_rank, world->rank(), world->size())) << what;
    if (world->size() > 1)
      EXPECT_LT(dp.trainer->optimizer().state_bytes(), alone.trainer->optimizer().state_bytes()) << what;
  }
}

// Optimizer offload to files (TrainerConfig::offload_optimizer) at every ZeRO stage: each rank's state, or its
// shards of it, in its files; the same bits as the run alone with its state in memory.
TEST(DataParallel, OffloadedStateKeepsTheBitsAtEveryZeroStage) {
  auto world = mt::dist::world();
  struct Case {
    mt::optim::Spec spec;
    std::vector<std::int64_t> stages;
  };
  // Adafactor's ZeRO steps whole rows of its own (Adafactor::RowShards), exchanging statistics.
  for (const auto& [spec, stages] : std::vector<Case>{
           {mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}), {0, 1, 2}},
           {mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1}), {0, 1, 2}},
           {mt::optim::Spec::adafactor({.lr = 1e-2, .beta1 = 0.9}), {1}}}) {
    Fixture alone = make(config_for(spec, 0, 1, world->size()), mt::dist::single_process());
    const RunResult want = finish(alone);
    for (const std::int64_t stage : stages) {
      TrainerConfig c = config_for(spec, 0, world->size(), world->size());
      c.zero = stage;
      // One directory for every rank (one config): each makes its own files there, gone as they are made.
      c.offload_optimizer = "file:" + std::filesystem::temp_directory_path().string();
      Fixture dp = make(c, world);
      const std::string what = spec.to_string() + " offloaded, zero " + std::to_string(stage) + " at " +
                               std::to_string(world->size());
      expect_same_bits(finish(dp), want, what);
      for (const auto& [key, t] : dp.trainer->optimizer().state_view())
        EXPECT_TRUE(key.ends_with(".step") || mt::in_state_arena(t)) << what << ": " << key;
    }
  }
}

// The optimizer state one rank keeps with Adafactor under ZeRO: its shard of each tensor is whole rows (a
// matrix's boundaries on multiples of lcm(256, n) elements, a vector's on 256), and every rank keeps a matrix's
// whole row and column statistics ((m + n) floats); a vector's statistic and the first moment cover the shard.
std::size_t adafactor_state_bytes(const mt::nn::Module& model, bool first_moment, int rank, int ranks) {
  std::size_t bytes = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const bool matrix = p.dim() >= 2;
    const std::int64_t n = matrix ? p.size(p.dim() - 1) : 1;
    const std::vector<std::int64_t> b = mt::dist::shard_bounds(p.numel(), ranks, matrix ? std::lcm<std::int64_t>(256, n) : 256);
    const auto mine = static_cast<std::size_t>(b[static_cast<std::size_t>(rank) + 1] - b[static_cast<std::size_t>(rank)]);
    bytes += matrix ? 4 * static_cast<std::size_t>(p.numel() / n + n) : 4 * mine;
    if (first_moment) bytes += 4 * mine;
  }
  return bytes;
}

// Adafactor at ZeRO-1 and 2: each rank steps whole rows, the ranks exchange the new row statistics, column sums
// of whole subtrees of the row tree and the update's squares (optim::Adafactor::RowShards), so the statistics
// and the clip factor are the run alone's: the same bits at any world size, with clipping active (grad_clip 1
// and Adafactor's own), with and without the first moment. Each rank's state is the formula's.
TEST(DataParallel, AdafactorShardsWholeRowsAndKeepsTheBits) {
  auto world = mt::dist::world();
  for (const bool first_moment : {false, true}) {
    const mt::optim::Spec spec =
        mt::optim::Spec::adafactor({.lr = 1e-2, .weight_decay = 0.1, .beta1 = first_moment ? 0.9 : 0.0});
    Fixture alone = make(config_for(spec, 0, 1, world->size()), mt::dist::single_process());
    const RunResult want = finish(alone);
    for (const std::int64_t stage : {1, 2}) {
      TrainerConfig c = config_for(spec, 0, world->size(), world->size());
      c.zero = stage;
      Fixture dp = make(c, world);
      const std::string what = spec.to_string() + " zero " + std::to_string(stage) + " at " + std::to_string(world->size());
      expect_same_bits(finish(dp), want, what);
      EXPECT_EQ(dp.trainer->optimizer().state_bytes(),
                adafactor_state_bytes(*dp.model, first_moment, world->rank(), world->size())) << what;
      if (world->size() > 1 && first_moment)
        EXPECT_LT(dp.trainer->optimizer().state_bytes(), alone.trainer->optimizer().state_bytes()) << what;
    }
  }
}

// Layer-wise updates across ranks: each parameter (ZeRO-0), or this rank's shard of it (ZeRO-1/2), is stepped
// on the trainer's thread as soon as its bucket's sum has landed, during the backward (buckets of 4 and 16 KiB,
// so most land before it ends), clipped to its share of grad_clip by the canonical norm of its whole summed
// gradient (at ZeRO-2 combined from every rank's blocks). The bits are those of the same global batch trained
// alone, layer-wise, with the canonical reduction, whose hooks complete each parameter's canonical sum before
// stepping it. grad_clip 0.5: most parameters are clipped to their share.
TEST(DataParallel, LayerwiseStepsEachShardAsItsSumLandsAndKeepsTheBits) {
  auto world = mt::dist::world();
  for (const mt::optim::Spec& spec : {mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}),
                                      mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1})}) {
    TrainerConfig one = config_for(spec, 0, 1, world->size());
    one.layerwise_update = true;
    one.grad_clip = 0.5;
    Fixture alone = make(one, mt::dist::single_process());
    const RunResult want = finish(alone);
    for (const std::int64_t stage : {0, 1, 2}) {
      TrainerConfig c = config_for(spec, 0, world->size(), world->size());
      c.layerwise_update = true;
      c.grad_clip = 0.5;
      c.zero = stage;
      Fixture dp = make(c, world, {.first_bucket_bytes = 4096, .bucket_bytes = 16384});
      const std::string what = spec.to_string() + " layer-wise, zero " + std::to_string(stage) + " at " +
                               std::to_string(world->size());
      expect_same_bits(finish(dp), want, what);
      const auto& got = dp.trainer->history();
      const auto& ref = alone.trainer->history();
      for (std::size_t s = 0; s < got.size(); ++s)
        EXPECT_EQ(got[s].grad_norm, ref[s].grad_norm) << what << ": the norm of step " << s + 1;
      if (world->size() > 1) EXPECT_GT(dp.dp->stats().early_buckets, 0) << what;
    }
  }
}

// A ZeRO-1 checkpoint is the main file plus one file of optimizer state per rank. Written at N ranks after 10
// of 20 steps, it resumes on the run alone's bits both alone (unsharded) and at N ranks (sharded again), and
// an unsharded checkpoint resumes into shards, each rank reading only its share; a missing shard file is refused
// naming it. With GaLore (a basis
// refresh falls on step 10, right after the resume) the shards hold ranges of R and every rank the basis; with
// Adafactor (first moment on) they hold whole rows, and every rank the row and column statistics.
TEST(DataParallel, ZeroOneCheckpointsResumeShardedOrAloneOnTheSameBits) {
  auto world = mt::dist::world();
  const mt::optim::Spec eight_bit = mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1});
  const mt::optim::Spec adafactor = mt::optim::Spec::adafactor({.lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.9});
  const std::vector<std::pair<mt::optim::Spec, std::int64_t>> runs = {{eight_bit, 0}, {eight_bit, 4}, {adafactor, 0}};
  for (const auto& [spec, galore_rank] : runs) {
    const std::string what = spec.to_string() + (galore_rank > 0 ? ", galore: " : ": ");
    Fixture alone = make(config_for(spec, galore_rank, 1, world->size()), mt::dist::single_process());
    const RunResult want = finish(alone);
    const std::vector<double> first_half(want.losses.begin(), want.losses.begin() + 10);
    TrainerConfig sharded = config_for(spec, galore_rank, world->size(), world->size());
    sharded.zero = 1;

    const std::string dir = world->broadcast_string(
        (std::filesystem::temp_directory_path() / ("memtrain_zero1_" + std::to_string(::getpid()))).string(), 0);
    if (world->rank() == 0) std::filesystem::create_directories(dir);
    world->barrier();
    const std::string path = dir + "/zero1.safetensors", plain = dir + "/plain.safetensors";
    {
      Fixture dp = make(sharded, world);
      for (int s = 0; s < 10; ++s) dp.trainer->train_step();
      dp.trainer->save_checkpoint(path);  // every rank: its shard file, then rank 0 the main file
      Fixture half = make(config_for(spec, galore_rank, 1, world->size()), mt::dist::single_process());
      for (int s = 0; s < 10; ++s) half.trainer->train_step();
      if (world->rank() == 0) half.trainer->save_checkpoint(plain);
      world->barrier();
    }
    if (world->size() > 1) {
      EXPECT_TRUE(std::filesystem::exists(path + ".rank1of" + std::to_string(world->size())));
      EXPECT_EQ(mt::io::load_safetensors_metadata(path).at("zero_shards"), std::to_string(world->size()));
    }
    {
      Fixture resumed = make(config_for(spec, galore_rank, 1, world->size()), mt::dist::single_process());
      resumed.trainer->load_checkpoint(path);
      expect_same_bits(finish(resumed, first_half), want, what + "zero 1 checkpoint resumed alone");
    }
    // Each rank reads its own share of the state from the ranges of the files that hold it, straight into its
    // optimizer: a load holds less besides than that share (reading the files whole held every rank's share).
    const auto load_holding_less_than_the_share = [&](Fixture& resumed, const std::string& file) {
      mt::Allocator& host = mt::Allocator::get(mt::Device::cpu());
      host.reset_peak();
      resumed.trainer->load_checkpoint(file);
      const std::size_t held_besides = host.stats().peak_bytes - host.stats().live_bytes;
      EXPECT_LT(held_besides, resumed.trainer->optimizer().state_bytes()) << what << file << ", rank " << world->rank();
    };
    {
      Fixture resumed = make(sharded, world);
      load_holding_less_than_the_share(resumed, path);
      expect_same_bits(finish(resumed, first_half), want, what + "zero 1 checkpoint resumed sharded");
    }
    {
      Fixture resumed = make(sharded, world);
      load_holding_less_than_the_share(resumed, plain);
      expect_same_bits(finish(resumed, first_half), want, what + "unsharded checkpoint resumed sharded");
    }
    world->barrier();
    if (world->size() > 1) {
      const std::string shard1 = path + ".rank1of" + std::to_string(world->size());
      if (world->rank() == 0) std::filesystem::rename(shard1, shard1 + ".moved");
      world->barrier();
      Fixture resumed = make(config_for(spec, galore_rank, 1, world->size()), mt::dist::single_process());
      const std::string e = mt::test_support::error_of([&] { resumed.trainer->load_checkpoint(path); });
      EXPECT_NE(e.find("shard file '" + shard1 + "' is missing"), std::string::npos) << what << e;
    }
    world->barrier();
    if (world->rank() == 0) std::filesystem::remove_all(dir);
    world->barrier();
  }
}

// A data-parallel run is predicted one rank at a time: each rank predicts itself on the meta device as a
// simulated rank (dist::simulate_rank: its buckets, shards and gathers, no data moved), then trains the run
// for real. The CPU allocator's peak over the same two steps and evaluation, each category at that peak and
// each category's own peak are the prediction's to the byte, at every ZeRO stage, on every rank, with and without 8-bit GaLore, and
// layer-wise; and with sums slowed to 5 ms a bucket, since a rank's live bytes must not depend on how fast its
// sums land (every allocation and free of the sums is made on the trainer's thread, one bucket in flight).
TEST(DataParallel, EachRankPredictsItsOwnPeakToTheByte) {
  auto world = mt::dist::world();
  const mt::optim::Spec eight_bit = mt::optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1});
  const mt::optim::Spec adafactor = mt::optim::Spec::adafactor({.lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.9});
  struct Run {
    mt::optim::Spec spec;
    std::int64_t galore_rank = 0;
    bool layerwise = false;
    double sum_delay = 0.0;
  };
  const std::vector<Run> runs = {{eight_bit}, {eight_bit, 4}, {adafactor}, {eight_bit, 0, true},
                                 {eight_bit, 0, false, 0.005}, {eight_bit, 0, true, 0.005}};
  for (const auto& [spec, galore_rank, layerwise, sum_delay] : runs)
  for (const std::int64_t stage : {0, 1, 2}) {
    TrainerConfig c = mt::test_support::short_run_config();
    c.optimizer = spec;
    c.galore_rank = galore_rank;
    c.layerwise_update = layerwise;
    c.grad_clip = layerwise ? 0.5 : c.grad_clip;
    c.world_size = world->size();
    c.grad_accum = world->size() <= 2 ? 2 : 1;
    c.zero = stage;
    mt::train::RunInputs in = mt::test_support::inputs_for(false);
    in.prepare = mt::dist::simulate_rank(world->rank(), {.first_bucket_bytes = 4096, .bucket_bytes = 16384});
    const mt::train::MemoryPrediction predicted = mt::train::predict_memory(c, in);
    const mt::test_support::Measured measured =
        mt::test_support::measure_on_cpu(c, false, [&](Trainer& t) {
          mt::dist::attach_data_parallel(
              t, world, {.first_bucket_bytes = 4096, .bucket_bytes = 16384, .sum_delay_seconds = sum_delay});
        });
    const std::string what = spec.to_string() + (galore_rank > 0 ? ", galore" : "") + (layerwise ? ", layer-wise" : "") +
                             (sum_delay > 0 ? ", slow sums" : "") +
                             ", zero " + std::to_string(stage) + ", rank " + std::to_string(world->rank()) + " of " +
                             std::to_string(world->size());
    EXPECT_EQ(predicted.peak_bytes_total, measured.peak_total) << what;
    for (int i = 0; i < mt::kNumMemoryCategories; ++i) {
      const std::string name(mt::category_name(static_cast<mt::MemoryCategory>(i)));
      EXPECT_EQ(predicted.peak_bytes_by_category.at(name), measured.at_peak[static_cast<std::size_t>(i)])
          << what << ": " << name << " at the peak";
      EXPECT_EQ(predicted.category_peak_bytes.at(name), measured.own_peak[static_cast<std::size_t>(i)])
          << what << ": " << name << "'s own peak";
    }
    world->barrier();
  }
}

TEST(DataParallel, RefusesAConfigThatDiffersBetweenRanksNamingTheField) {
  auto world = mt::dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  TrainerConfig c = config_for(mt::optim::Spec::adamw(), 0, world->size(), world->size());
  if (world->rank() == 1) c.seed = 77;
  try {
    make(c, world);
    ADD_FAILURE() << "a config that differs between ranks was accepted";
  } catch (const mt::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("seed: 77 here, 5 in the other"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
  }
}

TEST(DataParallel, RefusesAWorldSizeThatIsNotTheLaunchers) {
  auto world = mt::dist::world();
  TrainerConfig c = config_for(mt::optim::Spec::adamw(), 0, 1, 1);
  c.world_size = world->size() + 1;
  c.grad_accum = 1;
  try {
    make(c, world);
    ADD_FAILURE() << "world_size " << c.world_size << " was accepted in a group of " << world->size();
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the group has " + std::to_string(world->size()) + " ranks"),
              std::string::npos)
        << e.what();
  }
}
