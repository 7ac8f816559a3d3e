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

#include "tiny_lm.h"

#include <algorithm>
#include <limits>
#include <string>

namespace mt = memtrain;

namespace {

using mt::test_support::inputs_for;
using mt::test_support::measure_on_cpu;
using mt::test_support::short_run_config;
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
    double fastest = std::numeric_limits<double>::infinity(), fastest_without_galore = fastest;
    for (const mt::train::FitCandidate& c : r.candidates) {
      const mt::train::MemoryPrediction p = mt::train::predict_memory(c.config, inputs_for(false));
      const double t = model.step_seconds(p.step_work);
      if (p.peak_bytes_total <= budget) fastest = std::min(fastest, t);
      if (p.peak_bytes_total <= budget && c.config.galore_rank == 0) fastest_without_galore = std::min(fastest_without_galore, t);
      if (c.predicted) EXPECT_EQ(c.fits, p.peak_bytes_total <= budget) << c.knobs;
    }
    if (fastest == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(r.chosen.has_value()) << r.report();
      continue;
    }
    ASSERT_TRUE(r.chosen.has_value()) << "an exhaustive search fits at " << fastest << " s\n" << r.report();
    if (fastest_without_galore < std::numeric_limits<double>::infinity()) {
      EXPECT_EQ(r.chosen->galore_rank, 0) << r.report();
      fastest = fastest_without_galore;
    }
    EXPECT_LE(r.candidates[*r.chosen_index].step_seconds, fastest * 1.000001) << r.report();
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
