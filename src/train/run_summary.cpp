// RunSummary: what a run cost and reached, as JSON, plus the process's peak RSS.
#include "train/run_summary.h"

#include "io/atomic_file.h"
#include "memtrain/core/error.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace memtrain::train {

nlohmann::json RunSummary::to_json() const {
  nlohmann::json by_category = nlohmann::json::object();
  for (const auto& [name, bytes] : peak_bytes_by_category) by_category[name] = bytes;
  const auto or_null = [](bool present, const nlohmann::json& value) { return present ? value : nlohmann::json(); };
  nlohmann::json j = {
      {"config", config},
      {"steps", steps},
      {"skipped_steps", skipped_steps},
      {"stopped", stopped.empty() ? nlohmann::json(nullptr) : nlohmann::json(stopped)},
      {"final_train_loss", or_null(steps > 0, final_train_loss)},
      {"final_val_loss", final_val_loss ? nlohmann::json(*final_val_loss) : nlohmann::json(nullptr)},
      {"val_batches", or_null(final_eval.has_value(), final_eval ? final_eval->batches : 0)},
      {"val_samples", or_null(final_eval.has_value(), final_eval ? final_eval->samples : 0)},
      {"val_tokens", or_null(final_eval.has_value(), final_eval ? final_eval->tokens : 0)},
      {"tokens_per_second", tokens_per_second},
      {"samples_per_second", samples_per_second},
      {"median_step_seconds", median_step_seconds},
      {"peak_bytes_by_category", by_category},
      {"peak_bytes_total", peak_bytes_total},
      {"optimizer_state_bytes", optimizer_state_bytes},
      {"offloaded_state_bytes", offloaded_state_bytes},
      {"peak_rss_bytes", peak_rss_bytes},
      {"reserved_bytes", reserved_bytes},
      {"reserved_peak_bytes", reserved_peak_bytes},
      {"device", device},
      {"host_peak_bytes", host_peak_bytes},
  };
  if (!stages.is_null()) j["stages"] = stages;
  if (!ranks.is_null()) j["ranks"] = ranks;
  for (const auto& [name, value] : metrics) {
    MT_CHECK(!j.contains(name), "RunSummary::to_json", "metric '{}' has the name of a summary field", name);
    j[name] = value;
  }
  return j;
}

void write_summary(const RunSummary& summary, const std::string& path) {
  const std::string text = summary.to_json().dump(2) + "\n";
  ::memtrain::detail::AtomicFileWriter out(path, "write_summary");
  out.write(text.data(), text.size());
  out.commit();
}

namespace {
// A "<key>:   12345 kB" line of /proc/self/status, in bytes; 0 where /proc is absent.
std::size_t status_kib_field(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(std::strlen(key)));
    std::size_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;
}
}  // namespace

std::size_t peak_rss_bytes() { return status_kib_field("VmHWM:"); }
std::size_t current_rss_bytes() { return status_kib_field("VmRSS:"); }

void release_free_heap() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

namespace detail {

RunSummary summarize(const TrainerConfig& config, const std::vector<StepMetrics>& steps, const MemoryStats& memory,
                     std::size_t optimizer_state_bytes) {
  RunSummary s;
  s.config = config.to_json();
  s.steps = static_cast<std::int64_t>(steps.size());
  double seconds = 0.0;
  double tokens = 0.0;
  double samples = 0.0;
  std::vector<double> times;
  for (const StepMetrics& m : steps) {
    seconds += m.step_seconds;
    tokens += static_cast<double>(m.tokens);
    samples += static_cast<double>(m.samples);
    times.push_back(m.step_seconds);
    if (m.skipped) ++s.skipped_steps;
    if (m.val_loss) s.final_val_loss = m.val_loss;
  }
  if (!steps.empty()) s.final_train_loss = steps.back().loss;
  s.tokens_per_second = seconds > 0.0 ? tokens / seconds : 0.0;
  s.samples_per_second = seconds > 0.0 ? samples / seconds : 0.0;
  if (!times.empty()) {
    std::sort(times.begin(), times.end());
    const std::size_t n = times.size();
    s.median_step_seconds = n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  }
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    s.peak_bytes_by_category[std::string(category_name(static_cast<MemoryCategory>(c)))] =
        memory.by_category[c].at_total_peak;
  }
  s.peak_bytes_total = memory.peak_bytes;
  s.optimizer_state_bytes = optimizer_state_bytes;
  s.peak_rss_bytes = peak_rss_bytes();
  s.reserved_bytes = memory.reserved_bytes;
  s.reserved_peak_bytes = memory.reserved_peak_bytes;
  s.host_peak_bytes = memory.peak_bytes;  // fit() replaces it with the CPU allocator's on a device run
  return s;
}

nlohmann::json rank_memory_table(const std::function<std::vector<double>(const std::vector<double>&)>& gather,
                                 const char* index_key, const MemoryStats& stats, std::size_t optimizer_state_bytes,
                                 const std::vector<std::pair<std::string, double>>& extra) {
  std::vector<double> mine{static_cast<double>(stats.peak_bytes), static_cast<double>(optimizer_state_bytes)};
  for (int c = 0; c < kNumMemoryCategories; ++c) mine.push_back(static_cast<double>(stats.by_category[c].peak_bytes));
  for (const auto& [name, value] : extra) mine.push_back(value);
  const std::vector<double> all = gather(mine);
  nlohmann::json table = nlohmann::json::array();
  for (std::size_t at = 0; at < all.size(); at += mine.size()) {
    nlohmann::json by_category = nlohmann::json::object();
    for (int c = 0; c < kNumMemoryCategories; ++c)
      by_category[category_name(static_cast<MemoryCategory>(c))] = static_cast<std::size_t>(all[at + 2 + c]);
    nlohmann::json row = {{index_key, at / mine.size()},
                          {"peak_bytes_total", static_cast<std::size_t>(all[at])},
                          {"peak_bytes_by_category", by_category},
                          {"optimizer_state_bytes", static_cast<std::size_t>(all[at + 1])}};
    for (std::size_t e = 0; e < extra.size(); ++e) row[extra[e].first] = all[at + 2 + kNumMemoryCategories + e];
    table.push_back(std::move(row));
  }
  return table;
}

}  // namespace detail
}  // namespace memtrain::train
