// train::predict_memory against the run it predicts: the same configuration trained on the CPU for the steps
// the prediction covers (two optimizer steps and an evaluation), measured by the CPU allocator. Without
// prefetching loaders the prediction is exact, to the byte, in total and per category; with prefetching it
// adds the loaders' queues and must stay at or above the measured peak and within 1.5% of it.
#include <gtest/gtest.h>

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/optim/spec.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/train/fit.h"
#include "memtrain/train/predict.h"
#include "core/backend.h"
#include "core/work_counter.h"

#include "error_text.h"
#include "tiny_lm.h"
#include "token_dataset.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <random>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mt = memtrain;

namespace {

using mt::Device;
using mt::MemoryCategory;
using mt::train::TrainerConfig;

using mt::test_support::inputs_for;
using mt::test_support::measure_on_cpu;
using mt::test_support::Measured;
using mt::test_support::short_run_config;

struct Variant {
  std::string name;
  bool llama;
  std::function<void(TrainerConfig&)> configure;
};

std::vector<Variant> variants() {
  using mt::ckpt::Policy;
  using mt::optim::Spec;
  return {
      {"gpt adamw", false, [](TrainerConfig&) {}},
      {"gpt adamw8bit + selective", false,
       [](TrainerConfig& c) {
         c.optimizer = Spec::adamw8bit({.lr = 1e-3, .min_8bit_size = 256});
         c.activation_checkpointing = Policy::selective();
       }},
      {"gpt bf16 + accum 3", false,
       [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::bf16;
         c.grad_accum = 3;
       }},
      {"gpt galore + layerwise", false,
       [](TrainerConfig& c) {
         c.galore_rank = 4;
         c.layerwise_update = true;
       }},
      {"gpt fp16 + full", false,
       [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::fp16;
         c.activation_checkpointing = Policy::full();
       }},
      {"llama adafactor + budget", true,
       [](TrainerConfig& c) {
         c.optimizer = Spec::adafactor({.lr = 1e-2});
         c.activation_checkpointing = Policy::budget(64 * 1024);
       }},
      {"llama fp8", true, [](TrainerConfig& c) { c.precision = mt::amp::Precision::fp8; }},
      {"gpt lora bf16", false,
       [](TrainerConfig& c) {
         c.lora.rank = 4;
         c.precision = mt::amp::Precision::bf16;
       }},
      {"gpt qlora nf4 bf16 + selective", false,
       [](TrainerConfig& c) {
         c.lora.rank = 4;
         c.lora.quantize_nf4 = true;
         c.precision = mt::amp::Precision::bf16;
         c.activation_checkpointing = Policy::selective();
       }},
      {"llama lora + adamw8bit + layerwise + full", true,
       [](TrainerConfig& c) {
         c.lora.rank = 2;
         c.lora.targets = {"q_proj", "v_proj"};
         c.optimizer = Spec::adamw8bit({.lr = 1e-3, .min_8bit_size = 32});
         c.layerwise_update = true;
         c.activation_checkpointing = Policy::full();
       }},
  };
}

TEST(PredictMemory, EqualsTheCpuRunToTheByteWithoutPrefetch) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    TrainerConfig c = short_run_config(0);
    v.configure(c);
    const mt::train::MemoryPrediction p = mt::train::predict_memory(c, inputs_for(v.llama));
    const Measured m = measure_on_cpu(c, v.llama);
    ASSERT_GT(m.peak_total, 0u);
    EXPECT_EQ(p.device, "cpu");
    EXPECT_EQ(p.steps, 2);
    EXPECT_TRUE(p.evaluated);
    EXPECT_EQ(p.host_data_bytes, 0u);
    EXPECT_EQ(p.peak_bytes_total, m.peak_total);
    for (int i = 0; i < mt::kNumMemoryCategories; ++i) {
      const std::string name(mt::category_name(static_cast<MemoryCategory>(i)));
      EXPECT_EQ(p.peak_bytes_by_category.at(name), m.at_peak[i]) << "at the peak: " << name;
      EXPECT_EQ(p.category_peak_bytes.at(name), m.own_peak[i]) << "own peak: " << name;
    }
  }
}

TEST(PredictMemory, CoversThePrefetchQueuesWithin1Point5Percent) {
  for (const bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    const TrainerConfig c = short_run_config(2);
    const mt::train::MemoryPrediction p = mt::train::predict_memory(c, inputs_for(llama));
    const Measured m = measure_on_cpu(c, llama);
    // Two queued batches per loader of 4 windows x 16 tokens, inputs and targets in i64.
    EXPECT_EQ(p.host_data_bytes, 2u * 2u * (2u * 4u * 16u * 8u));
    EXPECT_GE(p.peak_bytes_total, m.peak_total);
    EXPECT_LE(static_cast<double>(p.peak_bytes_total), 1.015 * static_cast<double>(m.peak_total));
  }
}

TEST(PredictMemory, LeavesTheRngStreamAndTheCpuAllocatorAsTheyWere) {
  mt::manual_seed(77);
  const mt::RngState rng = mt::get_rng_state();
  const TrainerConfig c = short_run_config(0);
  const mt::train::RunInputs in = inputs_for(false);
  mt::Allocator& cpu = mt::Allocator::get(Device::cpu());
  const std::size_t live = cpu.stats().live_bytes;
  (void)mt::train::predict_memory(c, in);
  EXPECT_EQ(mt::get_rng_state().offset, rng.offset);
  EXPECT_EQ(mt::get_rng_state().seed, rng.seed);
  EXPECT_EQ(cpu.stats().live_bytes, live) << "the prediction left CPU tensors behind";
}

// The peak RSS estimate's baseline is read once the configuration's kernels have run in this process: a real run
// of it afterwards grows the resident set by what its allocator reserves, not by the code and runtime a first
// step faults in. The data the run holds beside the prediction is added on top.
TEST(PredictMemory, ReadsThePeakRssBaselineWithTheKernelsWarm) {
  TrainerConfig c = short_run_config(0);
  c.precision = mt::amp::Precision::bf16;
  c.optimizer.kind = mt::optim::OptimizerKind::adamw8bit;
  mt::train::RunInputs in = inputs_for(false);
  const mt::train::MemoryPrediction p = mt::train::predict_memory(c, in);
  EXPECT_TRUE(p.rss_note.empty()) << p.rss_note;
  in.resident_data_bytes = 5 << 20;
  const mt::train::MemoryPrediction q = mt::train::predict_memory(c, in);
  EXPECT_EQ(q.resident_data_bytes, 5u << 20);
  EXPECT_EQ(q.to_json().at("resident_data_bytes"), 5u << 20);
  // AddressSanitizer's shadow memory and quarantine grow the resident set as the process runs: no bound on the
  // RSS holds under it.
#ifndef __SANITIZE_ADDRESS__
  EXPECT_GE(q.peak_rss_bytes, mt::train::current_rss_bytes() + q.reserved_bytes + (5u << 20) - (1u << 20));
  const std::size_t before = mt::train::current_rss_bytes();
  (void)measure_on_cpu(c, false);
  const std::size_t after = mt::train::current_rss_bytes();
  // Measured here: 1.7 MiB with the warm-up, 10.6 MiB without it (warm_up_kernels = false).
  EXPECT_LE(after, before + p.reserved_bytes + (std::size_t{2} << 20))
      << "a real step brought in " << (after - before) << " bytes beyond the baseline; the prediction reserves "
      << p.reserved_bytes;
#endif
}

// A data-parallel config is predicted for one rank: without the hook that attaches a simulated one (dist, above
// train in the layers), the prediction says how to ask for it, and fitting needs the hook for every rank.
TEST(PredictMemory, AskForARankOfADataParallelRun) {
  TrainerConfig c = short_run_config(0);
  c.world_size = 2;
  c.grad_accum = 1;
  const std::string e = mt::test_support::error_of([&] { (void)mt::train::predict_memory(c, inputs_for(false)); });
  EXPECT_NE(e.find("world_size is 2"), std::string::npos) << e;
  EXPECT_NE(e.find("dist::simulate_rank(r)"), std::string::npos) << e;
  const std::string f =
      mt::test_support::error_of([&] { (void)mt::train::fit_to_budget(c, std::size_t{1} << 30, inputs_for(false)); });
  EXPECT_NE(f.find("fit_to_budget: world_size 2"), std::string::npos) << f;
  EXPECT_NE(f.find("RunInputs::prepare_rank"), std::string::npos) << f;
}

TEST(PredictMemory, PredictsACudaRunWithoutAGpuAndLeavesTheHostQueuesOut) {
  TrainerConfig c = short_run_config(2);
  c.device = Device::cuda(0);
  const mt::train::MemoryPrediction p = mt::train::predict_memory(c, inputs_for(false));
  EXPECT_EQ(p.device, "cuda:0");
  EXPECT_EQ(p.host_data_bytes, 0u);
  EXPECT_GT(p.peak_bytes_by_category.at("parameters"), 0u);
  // Reserved as a CUDA device's allocator reserves: whole 2 MiB segments (the CPU's size classes are not), the
  // meta allocator back to size classes afterwards (tests/test_device_allocator.cpp replays a trace on both).
  EXPECT_EQ(p.reserved_bytes % (std::size_t{2} << 20), 0u) << p.reserved_bytes;
  EXPECT_GE(p.reserved_bytes, p.peak_bytes_total);
  EXPECT_EQ(mt::Allocator::get(Device::meta()).cache_policy(), mt::CachePolicy::size_classes);
  c.device = Device::cpu();
  EXPECT_NE(mt::train::predict_memory(c, inputs_for(false)).reserved_bytes % (std::size_t{2} << 20), 0u);
}

TEST(PredictMemory, WritesThePredictionInTheShapeOfARunSummary) {
  const TrainerConfig c = short_run_config(0);
  const mt::train::MemoryPrediction p = mt::train::predict_memory(c, inputs_for(false));
  const std::string path = (std::filesystem::temp_directory_path() / "memtrain_test_prediction.json").string();
  mt::train::write_prediction(p, c, path);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("predicted").at("peak_bytes_total").get<std::size_t>(), p.peak_bytes_total);
  std::size_t sum = 0;
  for (const auto& [name, bytes] : j.at("predicted").at("peak_bytes_by_category").items()) sum += bytes.get<std::size_t>();
  EXPECT_EQ(sum, p.peak_bytes_total) << "the breakdown at the peak must add up to the peak";
  EXPECT_EQ(mt::train::TrainerConfig::from_json(j.at("config")).micro_batch, c.micro_batch);
  std::filesystem::remove(path);
}

// The prediction leaves the checkpoint save out: on the CPU it must write the state from where it lives, not
// from a second copy (which once made the save the peak of a gpt2-sized run: 2x the optimizer state).
TEST(PredictMemory, ACheckpointSaveHoldsNoCopyOfTheOptimizerState) {
  TrainerConfig c = short_run_config(0);
  const mt::train::RunInputs in = inputs_for(false);
  auto model = in.make_model();
  mt::train::Trainer trainer(c, model, in.make_loss(model), in.train, in.val);
  trainer.train_step();
  const std::size_t state = trainer.optimizer().state_bytes();
  ASSERT_GT(state, 0u);
  mt::Allocator& cpu = mt::Allocator::get(Device::cpu());
  const std::size_t live = cpu.stats().live_bytes;
  cpu.reset_peak();
  const std::string path = (std::filesystem::temp_directory_path() / "memtrain_test_predict_ckpt.safetensors").string();
  trainer.save_checkpoint(path);
  const std::size_t extra = cpu.stats().peak_bytes - live;
  EXPECT_LT(extra, state / 10) << "the save allocated " << extra << " bytes beside " << state << " of state";
  std::filesystem::remove(path);
}

TEST(PredictMemory, CountsTheStepsWorkByPrecision) {
  TrainerConfig c = short_run_config();
  const mt::train::MemoryPrediction f32 = mt::train::predict_memory(c, inputs_for(false));
  EXPECT_GT(f32.step_work.flops_f32, 0.0);
  EXPECT_EQ(f32.step_work.flops_narrow, 0.0);
  EXPECT_GT(f32.step_work.allocated_bytes, 0.0);
  // AdamW streams the gradient once and the parameter and both moments twice: 4 + 3 * 2 * 4 bytes a weight.
  std::size_t params = 0;
  for (const auto& [name, p] : inputs_for(false).make_model()->named_parameters()) params += p.numel();
  EXPECT_DOUBLE_EQ(f32.step_work.optimizer_bytes, 28.0 * static_cast<double>(params));
  c.precision = mt::amp::Precision::bf16;
  const mt::train::MemoryPrediction bf16 = mt::train::predict_memory(c, inputs_for(false));
  EXPECT_GT(bf16.step_work.flops_narrow, 0.0);
  // Full recompute runs each block's forward again: more products than without it.
  c.activation_checkpointing = mt::ckpt::Policy::full();
  const mt::train::MemoryPrediction full = mt::train::predict_memory(c, inputs_for(false));
  EXPECT_GT(full.step_work.flops_narrow + full.step_work.flops_f32, bf16.step_work.flops_narrow + bf16.step_work.flops_f32);
}

TEST(MetaWorkCounter, CountsAMatmulsProducts) {
  mt::detail::WorkCounts work;
  {
    mt::detail::WorkCounterGuard counting(&work);
    const mt::Tensor a = mt::Tensor::empty({3, 5, 7}, mt::DType::f32, Device::meta());
    const mt::Tensor b = mt::Tensor::empty({7, 11}, mt::DType::f32, Device::meta());
    (void)mt::ops::matmul(a, b);
    const mt::Tensor x = mt::Tensor::empty({4, 6}, mt::DType::bf16, Device::meta());
    const mt::Tensor w = mt::Tensor::empty({9, 6}, mt::DType::bf16, Device::meta());
    (void)mt::ops::linear(x, w, mt::Tensor());
  }
  EXPECT_DOUBLE_EQ(work.flops_f32, 2.0 * 3 * 5 * 11 * 7);
  EXPECT_DOUBLE_EQ(work.flops_narrow, 2.0 * 4 * 9 * 6);
  // Nothing is counted without a counter installed.
  const mt::Tensor a = mt::Tensor::empty({2, 2}, mt::DType::f32, Device::meta());
  (void)mt::ops::matmul(a, a);
  EXPECT_DOUBLE_EQ(work.flops_f32, 2.0 * 3 * 5 * 11 * 7);
}

TEST(ParameterDeviceGuard, BuildsOnMetaDrawingWhatTheCpuDraws) {
  mt::manual_seed(3);
  (void)mt::test_support::make_tiny_lm(false);
  const mt::RngState after_cpu = mt::get_rng_state();
  mt::manual_seed(3);
  mt::Allocator& cpu = mt::Allocator::get(Device::cpu());
  const std::size_t live = cpu.stats().live_bytes;
  {
    mt::nn::ParameterDeviceGuard on_meta(Device::meta());
    const auto model = mt::test_support::make_tiny_lm(false);
    for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.device(), Device::meta()) << name;
    EXPECT_EQ(cpu.stats().live_bytes, live) << "a meta model must not hold host memory";
  }
  EXPECT_EQ(mt::get_rng_state(), after_cpu);
  const auto back = mt::test_support::make_tiny_lm(false);
  for (const auto& [name, p] : back->named_parameters()) EXPECT_EQ(p.device(), Device::cpu()) << name;
}

// The meta allocator simulates the CPU's cache: on one trace of allocations and frees (sizes from a byte to
// 8 MiB, log-uniform; frees in random order) both reserve, cache and reuse exactly the same bytes.
TEST(PredictMemory, TheMetaAllocatorReservesWhatTheCpuAllocatorReservesOnATrace) {
  mt::Allocator host(Device::cpu(), mt::detail::backend_for(Device::cpu()).make_memory_source(0));
  mt::Allocator meta(Device::meta(), mt::detail::backend_for(Device::meta()).make_memory_source(0));
  std::mt19937_64 rng(7);
  std::vector<std::pair<mt::Block, mt::Block>> live;
  for (int op = 0; op < 4000; ++op) {
    if (!live.empty() && (rng() % 100 < 45 || live.size() > 300)) {
      const std::size_t k = rng() % live.size();
      host.deallocate(live[k].first);
      meta.deallocate(live[k].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      const auto bytes = static_cast<std::size_t>(std::exp2(static_cast<double>(rng() % 2300) / 100.0));
      const auto category = static_cast<mt::MemoryCategory>(rng() % mt::kNumMemoryCategories);
      live.emplace_back(host.allocate(bytes, category), meta.allocate(bytes, category));
    }
    const mt::MemoryStats h = host.stats(), m = meta.stats();
    ASSERT_EQ(m.reserved_bytes, h.reserved_bytes) << "op " << op;
    ASSERT_EQ(m.cached_bytes, h.cached_bytes) << "op " << op;
    ASSERT_EQ(m.cache_hits, h.cache_hits) << "op " << op;
    ASSERT_EQ(m.peak_bytes, h.peak_bytes) << "op " << op;
  }
  for (const auto& [h, m] : live) {
    host.deallocate(h);
    meta.deallocate(m);
  }
  EXPECT_GT(host.stats().cache_hits, 100u) << "the trace must exercise the cache";
}

TEST(PredictMemory, RefusesMissingInputsNamingThem) {
  const TrainerConfig c = short_run_config(0);
  mt::train::RunInputs in = inputs_for(false);
  in.train = nullptr;
  try {
    (void)mt::train::predict_memory(c, in);
    ADD_FAILURE() << "a prediction without a train set must throw";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RunInputs::train"), std::string::npos) << e.what();
  }
}

TEST(BlankDataset, CollatesZerosOfTheSampleShapes) {
  const mt::data::BlankDataset tokens(10, {16}, mt::DType::i64, {16});
  const mt::data::Batch b = tokens.collate({0, 3, 9});
  EXPECT_EQ(b.inputs.shape(), (mt::Shape{3, 16}));
  EXPECT_EQ(b.targets.shape(), (mt::Shape{3, 16}));
  EXPECT_EQ(b.targets.dtype(), mt::DType::i64);
  EXPECT_EQ(b.samples, 3);
  EXPECT_EQ(b.targets_count, 48);
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i) EXPECT_EQ(b.inputs.data<std::int64_t>()[i], 0);
  const mt::data::BlankDataset images(4, {1, 28, 28}, mt::DType::f32, {});
  const mt::data::Batch ib = images.collate({1, 2});
  EXPECT_EQ(ib.inputs.shape(), (mt::Shape{2, 1, 28, 28}));
  EXPECT_EQ(ib.targets.shape(), (mt::Shape{2}));
  EXPECT_EQ(ib.targets_count, 2);
  EXPECT_THROW(images.collate({4}), mt::Error);
  EXPECT_THROW(mt::data::BlankDataset(0, {1}, mt::DType::f32, {}), mt::Error);
  EXPECT_THROW(mt::data::BlankDataset(3, {0}, mt::DType::f32, {}), mt::Error);
}

}  // namespace
