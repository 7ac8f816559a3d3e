// Builds the RunSummary of a fit() from its steps and the allocator's statistics.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/train/trainer.h"

#include <vector>

namespace memtrain::train::detail {

// steps: the StepMetrics of this fit() only. Throughput is total tokens over total step time (evaluation
// and checkpoint time excluded); the step time is the median, robust to a slow first step.
RunSummary summarize(const TrainerConfig& config, const std::vector<StepMetrics>& steps, const MemoryStats& memory,
                     std::size_t optimizer_state_bytes);

}  // namespace memtrain::train::detail
