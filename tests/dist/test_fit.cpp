// fit_to_budget for a data-parallel run, run by ctest alone (skipped: one rank) and under mpirun at 2, 3 and 4
// ranks. Every process searches the same candidates for the whole world: each candidate's every rank is
// predicted as a simulated rank, it fits only when all do, and the ZeRO stage is one of the knobs. The choice is
// then trained for real on every rank and measured under the budget. The simulated collectives count the bytes
// a rank sends, held here to the ring formulas over the parameter bytes.
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/data_parallel.h"
#include "memtrain/train/fit.h"
#include "memtrain/train/predict.h"

#include "tiny_lm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::train::TrainerConfig;

namespace {

const mt::dist::DataParallelOptions kBuckets{.first_bucket_bytes = 4096, .bucket_bytes = 16384};

TrainerConfig base_config(std::int64_t ranks) {
  TrainerConfig c = mt::test_support::short_run_config();
  c.optimizer = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  c.world_size = ranks;
  c.grad_accum = ranks <= 2 ? 2 : 1;
  return c;
}

// `calls`, when given, counts the predictions made of each rank.
mt::train::RunInputs every_rank_inputs(std::vector<int>* calls = nullptr) {
  mt::train::RunInputs in = mt::test_support::inputs_for(false);
  in.prepare_rank = [calls](std::int64_t r) {
    if (calls != nullptr) ++calls->at(static_cast<std::size_t>(r));
    return mt::dist::simulate_rank(static_cast<int>(r), kBuckets);
  };
  return in;
}

// Fixed rates: the search must not depend on a timing, or ranks could choose differently.
mt::train::CostModel fixed_cost() {
  mt::train::CostModel m;
  m.f32_flops_per_second = m.narrow_flops_per_second = 1e10;
  m.bytes_per_second = m.communicated_bytes_per_second = 1e10;
  return m;
}

// Rank r's prediction of config, made by this process.
mt::train::MemoryPrediction predict_rank(const TrainerConfig& c, std::int64_t r) {
  mt::train::RunInputs in = mt::test_support::inputs_for(false);
  in.prepare = mt::dist::simulate_rank(static_cast<int>(r), kBuckets);
  return mt::train::predict_memory(c, in);
}

const mt::train::FitCandidate& candidate_at_stage(const mt::train::FitResult& r, std::int64_t stage) {
  const auto it = std::find_if(r.candidates.begin(), r.candidates.end(),
                               [&](const mt::train::FitCandidate& c) { return c.config.zero == stage; });
  EXPECT_NE(it, r.candidates.end()) << "no candidate at zero " << stage;
  return *it;
}

}  // namespace

// With only the ZeRO stage free and the budget the smallest of the stages' largest-rank peaks, the search
// chooses that stage (every other stage has a rank over the budget), reports the largest rank's peak having
// predicted every rank of each stage that fits, and every rank chooses the same; trained for real, no rank's
// CPU peak is over the budget. A budget one byte under a stage's largest rank refuses that stage though its
// other ranks fit.
TEST(DataParallelFit, ChoosesTheStageWhoseEveryRankFits) {
  auto world = mt::dist::world();
  const std::int64_t ranks = world->size();
  if (ranks == 1) GTEST_SKIP() << "a data-parallel fit needs ranks: run under mpirun";
  const TrainerConfig base = base_config(ranks);
  std::vector<std::size_t> largest(3, 0), smallest(3, SIZE_MAX);
  for (std::int64_t stage = 0; stage < 3; ++stage) {
    TrainerConfig c = base;
    c.zero = stage;
    for (std::int64_t r = 0; r < ranks; ++r) {
      const std::size_t peak = predict_rank(c, r).peak_bytes_total;
      largest[stage] = std::max(largest[stage], peak);
      smallest[stage] = std::min(smallest[stage], peak);
    }
  }
  const auto best = static_cast<std::int64_t>(std::min_element(largest.begin(), largest.end()) - largest.begin());
  const bool unique = std::count(largest.begin(), largest.end(), largest[best]) == 1;

  const mt::train::FitKnobs only_zero{.precision = false, .optimizer_state = false, .galore = false,
                                      .checkpointing = false, .accumulation = false, .layerwise = false, .zero = true};
  std::vector<int> calls(static_cast<std::size_t>(ranks), 0);
  const mt::train::FitResult r =
      mt::train::fit_to_budget(base, largest[best], every_rank_inputs(&calls), only_zero, fixed_cost());
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  const auto fitting = std::count_if(r.candidates.begin(), r.candidates.end(), [](const auto& c) { return c.fits; });
  for (std::int64_t q = 0; q < ranks; ++q) EXPECT_GE(calls[static_cast<std::size_t>(q)], fitting) << "rank " << q;
  EXPECT_EQ(r.candidates.size(), 3u);
  if (unique) EXPECT_EQ(r.chosen->zero, best) << r.report();
  EXPECT_EQ(r.candidates[*r.chosen_index].peak_bytes, largest[r.chosen->zero]) << r.report();
  for (std::int64_t stage = 0; stage < 3; ++stage)
    EXPECT_EQ(candidate_at_stage(r, stage).fits, largest[stage] <= largest[best])
        << "zero " << stage << "\n" << r.report();
  const std::vector<std::int64_t> chosen = world->all_gather_i64({r.chosen->zero});
  for (const std::int64_t z : chosen) EXPECT_EQ(z, chosen[0]) << "the ranks chose different stages";

  const mt::test_support::Measured measured = mt::test_support::measure_on_cpu(
      *r.chosen, false, [&](mt::train::Trainer& t) { mt::dist::attach_data_parallel(t, world, kBuckets); });
  EXPECT_LE(measured.peak_total, largest[best]) << "rank " << world->rank() << ", zero " << r.chosen->zero;
  world->barrier();

  // A stage whose ranks differ, one byte short of its largest: refused though its smaller ranks fit.
  for (std::int64_t stage = 0; stage < 3; ++stage) {
    if (smallest[stage] == largest[stage]) continue;
    const mt::train::FitKnobs fixed{.precision = false, .optimizer_state = false, .galore = false,
                                    .checkpointing = false, .accumulation = false, .layerwise = false, .zero = false};
    TrainerConfig at = base;
    at.zero = stage;
    const mt::train::FitResult tight = mt::train::fit_to_budget(at, largest[stage] - 1, every_rank_inputs(), fixed,
                                                                fixed_cost());
    EXPECT_FALSE(tight.chosen.has_value()) << "zero " << stage << ": a rank needs " << largest[stage] << " B\n"
                                           << tight.report();
  }
}

// Candidates the configuration check refuses across ranks (layer-wise GaLore) are reported with the reason and
// never predicted; the others are searched as usual.
TEST(DataParallelFit, ReportsRefusedCombinationsWithTheReason) {
  auto world = mt::dist::world();
  if (world->size() == 1) GTEST_SKIP() << "a data-parallel fit needs ranks: run under mpirun";
  const mt::train::FitKnobs knobs{.precision = false, .optimizer_state = false, .galore = true, .checkpointing = false,
                                  .accumulation = false, .layerwise = true, .zero = false};
  const mt::train::FitResult r = mt::train::fit_to_budget(base_config(world->size()), std::size_t{1} << 34,
                                                          every_rank_inputs(), knobs, fixed_cost());
  ASSERT_TRUE(r.chosen.has_value()) << r.report();
  std::size_t refused = 0;
  for (const mt::train::FitCandidate& c : r.candidates) {
    const bool layerwise_galore = c.config.layerwise_update && c.config.galore_rank > 0;
    EXPECT_EQ(c.note.rfind("refused:", 0) == 0, layerwise_galore) << c.knobs << ": " << c.note;
    if (!layerwise_galore) continue;
    ++refused;
    EXPECT_FALSE(c.predicted) << c.knobs;
    EXPECT_NE(c.note.find("layerwise_update with GaLore"), std::string::npos) << c.note;
  }
  EXPECT_EQ(refused, 1u);
  EXPECT_FALSE(r.chosen->layerwise_update && r.chosen->galore_rank > 0);
}

// The bytes a simulated rank's collectives send in a steady-state step, summed over the ranks, are the ring
// formulas over the parameter bytes P (f32 gradients of every parameter): a reduce-scatter sends every part but
// one's own, (N - 1) P in all; an all-gather sends each rank's part to the N - 1 others, (N - 1) P in all. ZeRO-0
// all-reduces (both), ZeRO-1 adds the gather of the stepped parameters, ZeRO-2 reduce-scatters and gathers.
TEST(DataParallelFit, SimulatedRanksCountTheBytesTheyWouldSend) {
  auto world = mt::dist::world();
  const std::int64_t ranks = world->size();
  if (ranks == 1) GTEST_SKIP() << "nothing is sent alone";
  double param_bytes = 0.0;
  for (const mt::Tensor& p : mt::test_support::make_tiny_lm(false)->parameters()) param_bytes += 4.0 * p.numel();
  const double n1 = static_cast<double>(ranks - 1);
  const std::vector<double> want = {2 * n1 * param_bytes, 3 * n1 * param_bytes, 2 * n1 * param_bytes};
  for (std::int64_t stage = 0; stage < 3; ++stage) {
    TrainerConfig c = base_config(ranks);
    c.zero = stage;
    double sent = 0.0;
    for (std::int64_t r = 0; r < ranks; ++r) sent += predict_rank(c, r).step_work.communicated_bytes;
    EXPECT_EQ(sent, want[stage]) << "zero " << stage << " at " << ranks << " ranks";
  }
}
