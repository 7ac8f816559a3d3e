// Builds the RunSummary of a fit() from its steps and the allocator's statistics.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/train/trainer.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace memtrain::train::detail {

// steps: the StepMetrics of this fit() only. Throughput is total tokens over total step time (evaluation
// and checkpoint time excluded); the step time is the median, robust to a slow first step.
RunSummary summarize(const TrainerConfig& config, const std::vector<StepMetrics>& steps, const MemoryStats& memory,
                     std::size_t optimizer_state_bytes);

// Every rank's memory, one entry per rank in rank order (each rank calls it): {index_key: rank,
// "peak_bytes_total", "peak_bytes_by_category", "optimizer_state_bytes", then each of `extra` by its name}, from
// this rank's allocator `stats` and optimizer state bytes. `gather` returns every rank's values, rank by rank.
nlohmann::json rank_memory_table(const std::function<std::vector<double>(const std::vector<double>&)>& gather,
                                 const char* index_key, const MemoryStats& stats, std::size_t optimizer_state_bytes,
                                 const std::vector<std::pair<std::string, double>>& extra = {});

}  // namespace memtrain::train::detail
