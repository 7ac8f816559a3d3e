// Pipeline parallelism in one process: the 1F1B and GPipe orders (every micro-batch once each way, backwards in
// order, what a stage keeps in flight, and no deadlock when all stages run them together, the tied weight's wait
// included), GPT stages (the whole model's parts and values; chained, the whole model's loss), and the config's
// refusals. The runs over MPI are in tests/dist/test_pipeline.cpp.
#include "memtrain/core/rng.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/pipeline.h"
#include "memtrain/train/trainer_config.h"

#include "error_text.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::train::PipelineAction;

namespace {

// Runs every stage's order together, an action starting only once what it needs is done: a forward the previous
// stage's forward of that micro-batch, a backward the next stage's backward (the last stage: its own forward).
// The last stage, after the backward of micro-batch i, waits for the first stage's backward of i - (P - 1)
// (the tied weight's gradient, train/trainer_pipeline.cpp), or of i - lag. Returns whether every action ran.
bool runs_to_the_end(const std::string& schedule, int stages, std::int64_t m, std::int64_t lag = -2) {
  if (lag == -2) lag = stages - 1;
  std::vector<std::vector<PipelineAction>> order;
  for (int s = 0; s < stages; ++s) order.push_back(mt::train::pipeline_order(schedule, s, stages, m));
  std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
  std::set<std::tuple<int, bool, std::int64_t>> done;  // (stage, forward, micro-batch)
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      auto& k = next[static_cast<std::size_t>(s)];
      if (k == order[static_cast<std::size_t>(s)].size()) continue;
      const PipelineAction a = order[static_cast<std::size_t>(s)][k];
      bool ready = a.forward ? (s == 0 || done.count({s - 1, true, a.micro_batch}) != 0)
                             : (s + 1 == stages ? done.count({s, true, a.micro_batch}) != 0
                                                : done.count({s + 1, false, a.micro_batch}) != 0);
      if (ready && s + 1 == stages && stages > 1 && k > 0) {
        const PipelineAction before = order[static_cast<std::size_t>(s)][k - 1];
        const std::int64_t waited = before.micro_batch - lag;
        if (!before.forward && waited >= 0) ready = done.count({0, false, waited}) != 0;
      }
      if (!ready) continue;
      done.insert({s, a.forward, a.micro_batch});
      ++k;
      moved = true;
    }
  }
  for (int s = 0; s < stages; ++s)
    if (next[static_cast<std::size_t>(s)] != order[static_cast<std::size_t>(s)].size()) return false;
  return true;
}

std::shared_ptr<mt::nn::GPT> make_gpt(mt::nn::GPTStage stage) {
  mt::manual_seed(3);
  mt::nn::GPTConfig c;
  c.vocab_size = 50;
  c.block_size = 8;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  return std::make_shared<mt::nn::GPT>(c, mt::DType::f32, stage);
}

bool same_values(const mt::Tensor& a, const mt::Tensor& b) {
  const mt::Tensor x = a.detach().contiguous(), y = b.detach().contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace

TEST(PipelineOrder, EachMicroBatchRunsForwardThenBackwardInOrderWithBoundedFlight) {
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    for (int stages = 1; stages <= 5; ++stages) {
      for (std::int64_t m = stages; m <= 11; ++m) {
        for (int s = 0; s < stages; ++s) {
          const auto order = mt::train::pipeline_order(schedule, s, stages, m);
          ASSERT_EQ(order.size(), static_cast<std::size_t>(2 * m));
          std::int64_t forwards = 0, backwards = 0, in_flight = 0, most = 0;
          for (const PipelineAction& a : order) {
            if (a.forward) {
              EXPECT_EQ(a.micro_batch, forwards++);
              most = std::max(most, ++in_flight);
            } else {
              EXPECT_EQ(a.micro_batch, backwards++);
              EXPECT_LT(a.micro_batch, forwards) << "a backward before its forward";
              --in_flight;
            }
          }
          EXPECT_EQ(forwards, m);
          EXPECT_EQ(backwards, m);
          EXPECT_EQ(most, schedule == "gpipe" ? m : std::min<std::int64_t>(stages - s, m))
              << schedule << ", stage " << s << " of " << stages << ", " << m << " micro-batches";
        }
        EXPECT_TRUE(runs_to_the_end(schedule, stages, m)) << schedule << ", " << stages << " stages, m " << m;
      }
    }
  }
}

TEST(PipelineOrder, TheSimulationSeesADeadlock) {
  // The check above would pass if the simulation never blocked: waiting, after the backward of i, for the first
  // stage's backward of i + 1 (which needs the last stage's own, still to come) is a cycle it must see.
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    EXPECT_FALSE(runs_to_the_end(schedule, 3, 6, -1)) << schedule;
    EXPECT_TRUE(runs_to_the_end(schedule, 3, 6, 0)) << schedule;
  }
  EXPECT_NE(mt::test_support::error_of([] { mt::train::pipeline_order("zigzag", 0, 2, 4); }).find("zigzag"),
            std::string::npos);
}

TEST(GPTStage, StagesHoldTheWholeModelsPartsWithItsValues) {
  const auto whole = make_gpt({});
  std::map<std::string, mt::Tensor> want;
  for (const auto& [name, t] : whole->named_parameters()) want[name] = t;
  std::map<std::string, int> held;
  std::int64_t next_block = 0;
  for (int s = 0; s < 3; ++s) {
    const auto stage = make_gpt({s, 3});
    const auto [begin, end] = stage->stage().blocks(whole->config());
    EXPECT_EQ(begin, next_block) << "stage " << s << ": the stages' blocks are contiguous";
    EXPECT_LT(begin, end) << "stage " << s << " has no block";
    next_block = end;
    for (const auto& [name, t] : stage->named_parameters()) {
      ASSERT_EQ(want.count(name), 1u) << name;
      EXPECT_TRUE(same_values(t, want.at(name))) << "stage " << s << ": " << name;
      ++held[name];
      // Only the last stage trains wte; the first holds a frozen copy.
      if (name == "wte.weight") EXPECT_EQ(t.requires_grad(), s == 2);
    }
  }
  EXPECT_EQ(next_block, 4);
  for (const auto& [name, t] : want) EXPECT_EQ(held[name], name == "wte.weight" ? 2 : 1) << name;
  EXPECT_NE(mt::test_support::error_of([] { make_gpt({0, 5}); }).find("5 pipeline stages for 4 blocks"),
            std::string::npos);
}

// The split's largest stage, in parameters trained (counted from the stage models themselves), is the smallest
// over every split of the blocks, enumerated.
TEST(GPTStage, TheSplitBalancesTheTrainedParameters) {
  mt::nn::GPTConfig c;
  c.vocab_size = 700, c.block_size = 8, c.n_layer = 7, c.n_head = 2, c.n_embd = 16;
  for (int stages = 2; stages <= 4; ++stages) {
    std::int64_t chosen = 0;
    std::vector<std::int64_t> trained(static_cast<std::size_t>(stages));  // the extra parameters of each stage
    for (int s = 0; s < stages; ++s) {
      mt::manual_seed(1);
      const mt::nn::GPT stage(c, mt::DType::f32, {s, stages});
      std::int64_t n = 0;
      for (const auto& [name, t] : stage.named_parameters())
        if (t.requires_grad()) n += t.numel();
      const auto [begin, end] = stage.stage().blocks(c);
      trained[static_cast<std::size_t>(s)] = n - (end - begin) * mt::nn::GPTStage::block_parameters(c);
      chosen = std::max(chosen, n);
    }
    const std::int64_t block = mt::nn::GPTStage::block_parameters(c);
    std::int64_t block_zero = 0;  // what block_parameters claims, counted
    mt::manual_seed(1);
    for (const auto& [name, t] : mt::nn::GPT(c).named_parameters())
      if (name.rfind("h.0.", 0) == 0) block_zero += t.numel();
    ASSERT_EQ(block, block_zero);
    // Every split: stage sizes >= 1 summing to n_layer.
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(stages), 1);
    const std::function<void(int, std::int64_t)> split = [&](int s, std::int64_t left) {
      if (s + 1 == stages) {
        std::int64_t worst = 0;
        sizes.back() = left;
        for (int q = 0; q < stages; ++q)
          worst = std::max(worst, sizes[static_cast<std::size_t>(q)] * block + trained[static_cast<std::size_t>(q)]);
        best = std::min(best, worst);
        return;
      }
      for (std::int64_t k = 1; k <= left - (stages - s - 1); ++k) {
        sizes[static_cast<std::size_t>(s)] = k;
        split(s + 1, left - k);
      }
    };
    split(0, c.n_layer);
    EXPECT_EQ(chosen, best) << stages << " stages";
  }
}

TEST(GPTStage, ChainedStagesGiveTheWholeModelsLoss) {
  std::vector<std::int64_t> tokens(17);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int64_t>((i * 37 + 11) % 50);
  const mt::Tensor idx = mt::tensor<std::int64_t>({tokens.begin(), tokens.end() - 1}, {2, 8});
  const mt::Tensor targets = mt::tensor<std::int64_t>({tokens.begin() + 1, tokens.end()}, {2, 8});
  const mt::Tensor want = make_gpt({})->loss(idx, targets);
  for (int stages : {2, 4}) {
    mt::Tensor x;
    for (int s = 0; s < stages; ++s) x = make_gpt({s, stages})->forward_stage(idx, x, targets).output;
    EXPECT_TRUE(same_values(x, want)) << stages << " stages: " << x.item() << " vs " << want.item();
  }
}

TEST(PipelineConfig, RefusesWhatThePipelineCannotRunNamingIt) {
  mt::train::TrainerConfig c;
  c.pipeline_stages = 4;
  c.grad_accum = 3;
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("pipeline_stages 4 with grad_accum 3"),
            std::string::npos);
  c.grad_accum = 4;
  c.validate();
  // Beside data parallelism, with ZeRO-1 at most.
  c.world_size = 2;
  c.validate();
  c.zero = 1;
  c.validate();
  c.zero = 2;
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("pipeline_stages 4 with zero 2"), std::string::npos);
  c.zero = 0;
  c.tensor_parallel = 2;
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("tensor_parallel 2 with pipeline_stages 4"),
            std::string::npos);
  c.tensor_parallel = 1;
  c.world_size = 1;
  c.pipeline_schedule = "interleaved";
  EXPECT_NE(mt::test_support::error_of([&] { c.validate(); }).find("'interleaved' is not one of"), std::string::npos);
}
