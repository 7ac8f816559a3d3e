// Pipeline parallelism: the schedules and the helpers of a stage's step. The Trainer's side (a step's
// micro-batches through the stages, evaluate(), the tied weight) is in trainer_pipeline.cpp; the link over MPI
// in src/dist/pipeline.cpp.
#include "memtrain/train/pipeline.h"

#include "memtrain/core/error.h"
#include "train/pipeline_stage.h"
#include "train/run_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace memtrain::train {

std::vector<PipelineAction> pipeline_order(const std::string& schedule, int stage, int stages,
                                           std::int64_t micro_batches) {
  const char* where = "train::pipeline_order";
  MT_CHECK(stages >= 1 && stage >= 0 && stage < stages, where, "stage {} of {}", stage, stages);
  MT_CHECK(micro_batches >= 1, where, "{} micro-batches", micro_batches);
  std::vector<PipelineAction> order;
  order.reserve(static_cast<std::size_t>(2 * micro_batches));
  if (schedule == "gpipe") {
    for (std::int64_t i = 0; i < micro_batches; ++i) order.push_back({true, i});
    for (std::int64_t i = 0; i < micro_batches; ++i) order.push_back({false, i});
    return order;
  }
  MT_CHECK(schedule == "1f1b", where, "schedule '{}' is not one of: 1f1b, gpipe", schedule);
  const std::int64_t warmup = std::min<std::int64_t>(stages - stage - 1, micro_batches);
  std::int64_t forwards = 0, backwards = 0;
  while (forwards < warmup) order.push_back({true, forwards++});
  while (forwards < micro_batches) {
    order.push_back({true, forwards++});
    order.push_back({false, backwards++});
  }
  while (backwards < micro_batches) order.push_back({false, backwards++});
  return order;
}

namespace detail {

std::vector<Tensor> untied(const PipelineStage& stage, const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params)
    if (!stage.tied.defined() || p.impl_ptr() != stage.tied.impl_ptr()) out.push_back(p);
  return out;
}

void combine_stage_blocks(const PipelineStage& stage, std::vector<double>& blocks) {
  const std::vector<double> all = stage.link->gather_f64(blocks);
  const std::size_t n = blocks.size();
  for (std::size_t b = 0; b < n; ++b) {
    double sum = all[b];
    for (int r = 1; r < stage.stages; ++r) sum += all[static_cast<std::size_t>(r) * n + b];
    blocks[b] = sum;
  }
}

nlohmann::json stage_table(const PipelineStage& stage, const MemoryStats& stats, std::size_t optimizer_state_bytes) {
  const double idle = stage.step_seconds > 0.0 ? stage.idle_seconds / stage.step_seconds : 0.0;
  return rank_memory_table([&](const std::vector<double>& mine) { return stage.link->gather_f64(mine); }, "stage",
                           stats, optimizer_state_bytes, {{"idle_fraction", idle}});
}

}  // namespace detail

}  // namespace memtrain::train
