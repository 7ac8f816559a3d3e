// A run's metrics drawn over its steps: metrics_svg() reads the lines of a metrics JSONL file (what the Trainer
// writes to config.metrics_path, StepMetrics::to_json) and draws four panels, one above the other: the training
// loss (with the validation loss as dots where an evaluation ran), tokens per second, the allocator's peak in
// MiB, and the learning rate. memtrain_plot is the command-line front of it.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace memtrain::train {

// One JSON object per step, each with at least "step"; a panel's key missing from a line leaves that step out
// of the panel. Throws memtrain::Error naming the line when a line has no numeric "step", or when no line has
// any of the four keys.
std::string metrics_svg(const std::vector<nlohmann::json>& lines, const std::string& title);

// Writes metrics_svg(lines, title) to path atomically.
void write_metrics_svg(const std::vector<nlohmann::json>& lines, const std::string& title, const std::string& path);

// The lines of a metrics JSONL file; throws naming the file and the line number of one that is not JSON.
std::vector<nlohmann::json> read_metrics_jsonl(const std::string& path);

}  // namespace memtrain::train
