// train::fit_to_budget: the configuration it chooses must measure within the budget when trained on the CPU, it
// must find a fitting configuration whenever predicting every candidate finds one (its pruning is sound) and
// choose one as fast, by the same cost model, as the best of those; with nothing that fits it refuses with the
// smallest breakdown. And byte sizes as people write them.
#include <gtest/gtest.h>

#include "memtrain/core/byte_size.h"
#include "memtrain/core/error.h"
#include "memtrain/data/tensor_dataset.h"
#include "memtrain/nn/containers.h"
#include "memtrain/nn/linear.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/train/fit.h"

#include "error_text.h"
#include "temp_dir.h"
#include "tiny_lm.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <string>

namespace mt = memtrain;

namespace {

using mt::test_support::inputs_for;
using mt::test_support::measure_on_cpu;
using mt::test_support::short_run_config;
using mt::test_support::error_of;
using mt::test_support::TempDir;
using mt::train::RunInputs;
using mt::train::TrainerConfig;

// Fixed rates, so the test does not time anything: bf16 GEMMs twice as fast as f32, 10 GB/s.
mt::train::CostModel fixed_model() { return {.f32_flops_per_second = 5e10, .narrow_flops_per_second = 1e11,
                                             .bytes_per_second = 1e10, .calibration_seconds = 0.0}; }

// The fp32 AdamW run with no memory technique: the peak the budgets are fractions of.
std::size_t plain_peak(const TrainerConfig& base) {
  return mt::train::predict_memory(base, inputs_for(false)).peak_bytes_total;
}

TEST(FitToBudget, ChoosesARunThatMeasuresWithinTheBudget) {
  TrainerConfig base = short_run_config();
  base.micro_batch = 8;
  const std::size_t plain = plain_peak(base);
  for (const double fraction : {0.75, 0.5, 0.35}) {
    const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(plain));
    SCOPED_TRACE(fraction);
    const mt::train::FitResult r = mt::train::fit_to_budget(base, budget, inputs_for(false), {}, fixed_model());
    ASSERT_TRUE(r.chosen.has_value()) << r.report();
    EXPECT_EQ(r.chosen->memory_budget_bytes, budget);
    EXPECT_EQ(r.chosen->micro_batch * r.chosen->grad_accum, 8) << "the global batch must stay";
    EXPECT_LE(r.chosen_prediction->peak_bytes_total, budget);
    const mt::test_support::Measured m = measure_on_cpu(*r.chosen, false);
    EXPECT_LE(m.peak_total, budget) << r.report();
    EXPECT_NE(r.report().find("chosen: "), std::string::npos) << r.report();
  }
}

TEST(FitToBudget, FindsWhatPredictingEveryCandidateFindsAndIsAsFast) {
  TrainerConfig base = short_run_config();
  base.micro_batch = 4;
  const std::size_t plain = plain_peak(base);
  const mt::train::CostModel model = fixed_model();
  for (const double fraction : {0.8, 0.65, 0.5, 0.4, 0.3, 0.2, 0.05}) {
    const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(plain));
    SCOPED_TRACE(fraction);
    const mt::train::FitResult r = mt::train::fit_to_budget(base, budget, inputs_for(false), {}, model);
    // Every candidate predicted, none skipped; GaLore only when nothing without it fits.
    // The fastest that fits in each tier of preference, GaLore's before the weights': 0 with neither, 1 with bf16
    // weights, 2 with GaLore, 3 with both.
    constexpr double kNone = std::numeric_limits<double>::infinity();
    std::array<double, 4> fastest{kNone, kNone, kNone, kNone};
    for (const mt::train::FitCandidate& c : r.candidates) {
      if (c.note.starts_with("refused")) continue;
      const mt::train::MemoryPrediction p = mt::train::predict_memory(c.config, inputs_for(false));
      const std::size_t tier = (c.config.galore_rank > 0 ? 2 : 0) + (c.config.param_dtype != mt::amp::ParamDtype::f32 ? 1 : 0);
      if (p.peak_bytes_total <= budget) fastest[tier] = std::min(fastest[tier], model.step_seconds(p.step_work));
      if (c.predicted) EXPECT_EQ(c.fits, p.peak_bytes_total <= budget) << c.knobs;
    }
    const auto tier = std::find_if(fastest.begin(), fastest.end(), [](double t) { return t < kNone; });
    if (tier == fastest.end()) {
      EXPECT_FALSE(r.chosen.has_value()) << r.report();
      continue;
    }
    ASSERT_TRUE(r.chosen.has_value()) << "an exhaustive search fits at " << *tier << " s\n" << r.report();
    const auto chosen_tier = tier - fastest.begin();
    EXPECT_EQ(r.chosen->galore_rank > 0, chosen_tier >= 2) << r.report();
    EXPECT_EQ(r.chosen->param_dtype != mt::amp::ParamDtype::f32, chosen_tier % 2 == 1) << r.report();
    EXPECT_LE(r.candidates[*r.chosen_index].step_seconds, *tier * 1.000001) << r.report();
  }
}

// Layer-wise updates free each gradient during the backward, unless the step accumulates micro-batches: then
// a smaller micro-batch needs more memory, and must not be taken for the smaller footprint.
TEST(FitToBudget, KnowsThatAccumulationKeepsTheGradientsOfALayerwiseStep) {
  TrainerConfig base = short_run_config();
  base.layerwise_update = true;
  base.activation_checkpointing = mt::ckpt::Policy::full();
  mt::train::FitKnobs knobs;
  knobs.precision = knobs.optimizer_state = knobs.galore = knobs.checkpointing = knobs.layerwise = false;
  TrainerConfig whole = base, split = base;
  split.micro_batch = 1;
  split.grad_accum = 4;
  const std::size_t whole_peak = mt::train::predict_memory(whole, inputs_for(false)).peak_bytes_total;
  const std::size_t split_peak = mt::train::predict_memory(split, inputs_for(false)).peak_bytes_total;
  ASSERT_LT(whole_peak, split_peak) << "the case this test is about does not arise for this model";
  const std::size_t budget = (whole_peak + split_peak) / 2;
  const mt::train::FitResult r = mt::train::fit_to_budget(base, budget, inputs_for(false), knobs, fixed_model());
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  EXPECT_EQ(r.chosen->micro_batch, 4);
}

TEST(FitToBudget, RefusesWhenNothingFitsWithTheSmallestBreakdown) {
  const TrainerConfig base = short_run_config();
  const mt::train::FitResult r = mt::train::fit_to_budget(base, 16 * 1024, inputs_for(false), {}, fixed_model());
  EXPECT_FALSE(r.chosen.has_value());
  ASSERT_TRUE(r.smallest.has_value());
  EXPECT_GT(r.smallest->peak_bytes_total, 16u * 1024u);
  const std::string report = r.report();
  EXPECT_NE(report.find("nothing fits"), std::string::npos) << report;
  EXPECT_NE(report.find("parameters"), std::string::npos) << "the breakdown must be printed:\n" << report;
  // The smallest footprint is the one with every memory technique on.
  EXPECT_NE(r.smallest_knobs.find("ckpt full"), std::string::npos) << r.smallest_knobs;
  EXPECT_NE(r.smallest_knobs.find("micro-batch 1"), std::string::npos) << r.smallest_knobs;
  EXPECT_NE(r.smallest_knobs.find("layer-wise"), std::string::npos) << r.smallest_knobs;
}

TEST(FitToBudget, KeepsTheKnobsItMayNotChange) {
  TrainerConfig base = short_run_config();
  base.precision = mt::amp::Precision::bf16;
  mt::train::FitKnobs knobs;
  knobs.precision = false;
  knobs.accumulation = false;
  const std::size_t plain = plain_peak(base);
  const mt::train::FitResult r =
      mt::train::fit_to_budget(base, plain / 2, inputs_for(false), knobs, fixed_model());
  for (const mt::train::FitCandidate& c : r.candidates) {
    EXPECT_EQ(c.config.precision, mt::amp::Precision::bf16) << c.knobs;
    EXPECT_EQ(c.config.micro_batch, base.micro_batch) << c.knobs;
  }
}

// A model whose weights the default GaLore rule does not know: the search offers GaLore over the weights
// galore_targets chooses, at a quarter of their smallest dimension, and carries the targets into the run.
TEST(FitToBudget, OffersGaLoreOverTheConfiguredTargets) {
  static constexpr std::int64_t kIn = 24, kHidden = 48, kOut = 16, kSamples = 32;
  RunInputs inputs;
  inputs.make_model = [] {
    return std::make_shared<mt::nn::Sequential>(std::make_shared<mt::nn::Linear>(kIn, kHidden),
                                                [](const mt::Tensor& x) { return mt::ops::relu(x); },
                                                std::make_shared<mt::nn::Linear>(kHidden, kOut));
  };
  inputs.make_loss = [](const std::shared_ptr<mt::nn::Module>& m) -> mt::train::LossFn {
    auto seq = std::static_pointer_cast<mt::nn::Sequential>(m);
    return [seq](const mt::data::Batch& b) { return mt::ops::mse_loss(seq->forward(b.inputs), b.targets); };
  };
  inputs.train = std::make_shared<mt::data::TensorDataset>(mt::zeros({kSamples, kIn}), mt::zeros({kSamples, kOut}));
  TrainerConfig base = short_run_config();
  base.galore_targets = {"0.weight", "2.weight"};
  mt::train::FitKnobs knobs;
  knobs.precision = knobs.optimizer_state = knobs.checkpointing = knobs.accumulation = knobs.layerwise = false;
  const mt::train::FitResult r = mt::train::fit_to_budget(base, std::size_t{1} << 30, inputs, knobs, fixed_model());
  std::int64_t offered_rank = 0;
  for (const mt::train::FitCandidate& c : r.candidates) {
    offered_rank = std::max(offered_rank, c.config.galore_rank);
    EXPECT_EQ(c.config.galore_targets, base.galore_targets) << c.knobs;
  }
  EXPECT_EQ(offered_rank, std::min(kHidden, kOut) / 4) << r.report();
}

// Every knob but one held fixed: the search may change only `free_knob` of `base`.
mt::train::FitKnobs only(bool mt::train::FitKnobs::*free_knob) {
  mt::train::FitKnobs knobs;
  knobs.precision = knobs.optimizer_state = knobs.galore = knobs.checkpointing = knobs.accumulation =
      knobs.layerwise = knobs.zero = knobs.param_dtype = false;
  if (free_knob != nullptr) knobs.*free_knob = true;
  return knobs;
}

// bf16 weights round every update: they are chosen when nothing with f32 weights fits, and only then, even when
// the cost model finds them faster.
TEST(FitToBudget, TakesBf16WeightsOnlyWhenF32WeightsDoNotFit) {
  TrainerConfig base = short_run_config();
  base.precision = mt::amp::Precision::bf16;
  TrainerConfig narrow = base;
  narrow.param_dtype = mt::amp::ParamDtype::bf16;
  const mt::train::MemoryPrediction wide_p = mt::train::predict_memory(base, inputs_for(false));
  const mt::train::MemoryPrediction narrow_p = mt::train::predict_memory(narrow, inputs_for(false));
  ASSERT_LT(narrow_p.peak_bytes_total, wide_p.peak_bytes_total);
  const mt::train::FitKnobs knobs = only(&mt::train::FitKnobs::param_dtype);
  mt::train::FitResult r = mt::train::fit_to_budget(base, wide_p.peak_bytes_total, inputs_for(false), knobs,
                                                    fixed_model());
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  EXPECT_EQ(r.chosen->param_dtype, mt::amp::ParamDtype::f32) << r.report();
  const std::size_t between = (narrow_p.peak_bytes_total + wide_p.peak_bytes_total) / 2;
  r = mt::train::fit_to_budget(base, between, inputs_for(false), knobs, fixed_model());
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  EXPECT_EQ(r.chosen->param_dtype, mt::amp::ParamDtype::bf16) << r.report();
  EXPECT_NE(r.report().find("params bf16"), std::string::npos) << r.report();
  EXPECT_LE(measure_on_cpu(*r.chosen, false).peak_total, between);
}

// Between full checkpointing's peak and none's, a budget policy keeps what fits and recomputes less than full.
TEST(FitToBudget, FillsTheHeadroomWithABudgetPolicy) {
  TrainerConfig base = short_run_config();
  base.micro_batch = 8;
  TrainerConfig full = base;
  full.activation_checkpointing = mt::ckpt::Policy::full();
  const mt::train::MemoryPrediction none_p = mt::train::predict_memory(base, inputs_for(false));
  const mt::train::MemoryPrediction full_p = mt::train::predict_memory(full, inputs_for(false));
  ASSERT_LT(full_p.peak_bytes_total, none_p.peak_bytes_total);
  const std::size_t budget = full_p.peak_bytes_total + (none_p.peak_bytes_total - full_p.peak_bytes_total) * 3 / 4;
  const mt::train::CostModel model = fixed_model();
  const mt::train::FitResult r =
      mt::train::fit_to_budget(base, budget, inputs_for(false), only(&mt::train::FitKnobs::checkpointing), model);
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  EXPECT_EQ(r.chosen->activation_checkpointing.kind, mt::ckpt::Policy::Kind::budget) << r.report();
  const double full_seconds = model.step_seconds(full_p.step_work);
  EXPECT_LT(r.candidates[*r.chosen_index].step_seconds, full_seconds) << "a budget policy recomputes less";
  EXPECT_LE(r.chosen_prediction->peak_bytes_total, budget);
  EXPECT_LE(measure_on_cpu(*r.chosen, false).peak_total, budget) << r.report();
  // Nothing is left on the table: a budget a sixty-fourth of the memory budget larger would not fit.
  TrainerConfig wider = *r.chosen;
  wider.activation_checkpointing =
      mt::ckpt::Policy::budget(r.chosen->activation_checkpointing.budget_bytes + std::max<std::size_t>(budget / 64, 64 << 10) + 1024);
  EXPECT_GT(mt::train::predict_memory(wider, inputs_for(false)).peak_bytes_total, budget)
      << "the bisection stopped short: " << wider.activation_checkpointing.to_string() << " fits too";
}

// With a directory to offload to, the search may put the optimizer state in files: chosen when only that fits,
// not when state in memory fits and is faster.
TEST(FitToBudget, OffloadsTheStateWhenThatIsWhatFits) {
  TempDir dir;
  TrainerConfig base = short_run_config();
  TrainerConfig files = base;
  files.offload_optimizer = "file:" + dir.path();
  const mt::train::MemoryPrediction memory_p = mt::train::predict_memory(base, inputs_for(false));
  const mt::train::MemoryPrediction files_p = mt::train::predict_memory(files, inputs_for(false));
  ASSERT_LT(files_p.peak_bytes_total, memory_p.peak_bytes_total);
  mt::train::FitKnobs knobs = only(nullptr);
  knobs.offload_dir = dir.path();
  mt::train::CostModel model = fixed_model();
  model.offload_small_bytes_per_second = model.offload_huge_bytes_per_second = 1e9;
  mt::train::FitResult r = mt::train::fit_to_budget(base, memory_p.peak_bytes_total, inputs_for(false), knobs, model);
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  EXPECT_EQ(r.chosen->offload_optimizer, "none") << "state in files costs time: " << r.report();
  const std::size_t between = (files_p.peak_bytes_total + memory_p.peak_bytes_total) / 2;
  r = mt::train::fit_to_budget(base, between, inputs_for(false), knobs, model);
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  EXPECT_EQ(r.chosen->offload_optimizer, "file:" + dir.path()) << r.report();
  EXPECT_GT(r.candidates[*r.chosen_index].step_seconds, model.step_seconds(memory_p.step_work))
      << "the cost model must charge for the files";
  EXPECT_LE(measure_on_cpu(*r.chosen, false).peak_total, between);
}

// A free knob still offers the base's own value when the search's usual values do not hold it: fp16 compute,
// bf16 weights with Kahan compensation.
TEST(FitToBudget, OffersTheBasesOwnValueOfAFreeKnob) {
  TrainerConfig base = short_run_config();
  base.precision = mt::amp::Precision::fp16;
  mt::train::FitKnobs knobs = only(&mt::train::FitKnobs::precision);
  mt::train::FitResult r = mt::train::fit_to_budget(base, std::size_t{1} << 30, inputs_for(false), knobs, fixed_model());
  std::set<mt::amp::Precision> offered;
  for (const mt::train::FitCandidate& c : r.candidates) offered.insert(c.config.precision);
  EXPECT_EQ(offered, (std::set{mt::amp::Precision::fp32, mt::amp::Precision::bf16, mt::amp::Precision::fp16}));
  base.precision = mt::amp::Precision::bf16;
  base.param_dtype = mt::amp::ParamDtype::bf16_kahan;
  r = mt::train::fit_to_budget(base, std::size_t{1} << 30, inputs_for(false), only(&mt::train::FitKnobs::param_dtype),
                               fixed_model());
  std::set<mt::amp::ParamDtype> dtypes;
  for (const mt::train::FitCandidate& c : r.candidates) dtypes.insert(c.config.param_dtype);
  EXPECT_EQ(dtypes, (std::set{mt::amp::ParamDtype::f32, mt::amp::ParamDtype::bf16, mt::amp::ParamDtype::bf16_kahan}));
}

TEST(CostModel, CalibratesPositiveRatesAndAddsUpWork) {
  const mt::train::CostModel m = mt::train::CostModel::calibrate();
  EXPECT_GT(m.f32_flops_per_second, 1e8);
  EXPECT_GT(m.narrow_flops_per_second, 1e8);
  EXPECT_GT(m.bytes_per_second, 1e8);
  const mt::train::CostModel f = fixed_model();
  const mt::train::StepWork w{.flops_f32 = 5e10, .flops_narrow = 1e11, .allocated_bytes = 5e9, .optimizer_bytes = 5e9};
  EXPECT_DOUBLE_EQ(f.step_seconds(w), 1.0 + 1.0 + 1.0);
  EXPECT_NE(m.describe().find("GFLOP/s"), std::string::npos);
}

TEST(CostModel, ChargesStateInFilesByHowItIsMapped) {
  TempDir dir;
  mt::train::CostModel m = fixed_model();
  mt::train::StepWork w{.offloaded_small_bytes = 2e9, .offloaded_huge_bytes = 3e9};
  EXPECT_NE(error_of([&] { (void)m.step_seconds(w); }).find("calibrate_offload"), std::string::npos)
      << "no rates: refused, not divided by zero";
  m.calibrate_offload(dir.path());
  EXPECT_GT(m.offload_small_bytes_per_second, 1e7);
  EXPECT_GT(m.offload_huge_bytes_per_second, 1e7);
  EXPECT_NE(m.describe().find("state in files"), std::string::npos) << m.describe();
  EXPECT_TRUE(dir.entries().empty()) << "the calibration's files are gone";
  m.offload_small_bytes_per_second = 1e9;
  m.offload_huge_bytes_per_second = 3e9;
  EXPECT_DOUBLE_EQ(m.step_seconds(w), 2.0 + 1.0);
}

TEST(ByteSize, ParsesWhatPeopleWrite) {
  EXPECT_EQ(mt::parse_byte_size("1.5GiB", "t"), std::size_t{3} << 29);
  EXPECT_EQ(mt::parse_byte_size("800MiB", "t"), std::size_t{800} << 20);
  EXPECT_EQ(mt::parse_byte_size("64KiB", "t"), std::size_t{64} << 10);
  EXPECT_EQ(mt::parse_byte_size("4096", "t"), 4096u);
  EXPECT_EQ(mt::parse_byte_size("4096B", "t"), 4096u);
  EXPECT_EQ(mt::parse_byte_size("2TiB", "t"), std::size_t{2} << 40);
  for (const char* bad : {"1.5Gib", "1.5GB", "GiB", "", "-1GiB", "0", "0.1B", "1e400GiB", "1.5 GiB"}) {
    try {
      (void)mt::parse_byte_size(bad, "--fit");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const mt::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--fit"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
    }
  }
  try {
    (void)mt::parse_byte_size("1.5Gib", "--fit");
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("KiB, MiB, GiB"), std::string::npos) << "name the accepted units: " << e.what();
  }
}

}  // namespace
