// What fit() shows and records while it runs: the progress line on stderr and the metrics JSONL file.
#pragma once

#include "memtrain/train/trainer.h"

#include <cstdio>
#include <fstream>
#include <string>

namespace memtrain::train::detail {

std::string format_bytes(std::size_t bytes);     // "123.4 MiB"
std::string format_duration(double seconds);     // "1h02m", "3m07s", "12s"
std::string format_rate(double per_second);      // "12.3k"

// One progress line: "step 12/100 | loss 3.2145 | lr 6.00e-04 | norm 0.812 | 12.3k tok/s | peak 1.2 MiB |
// ETA 1m23s" (samples/s when a step's tokens are its samples, i.e. a classifier), " | val 3.1000" when an
// evaluation ran.
std::string progress_line(const StepMetrics& m, std::int64_t max_steps, double eta_seconds);

// On a terminal (live), one line rewritten in place with "\r" after every step, made permanent when it
// carries a val loss and at the end; otherwise a plain line every log_interval steps and at the last.
class ProgressPrinter {
 public:
  ProgressPrinter(std::int64_t max_steps, std::int64_t log_interval, bool live, std::FILE* out = stderr);
  ~ProgressPrinter();  // ends a live line
  void update(const StepMetrics& m, double eta_seconds);
  void finish();

 private:
  std::int64_t max_steps_;
  std::int64_t log_interval_;
  bool live_;
  std::FILE* out_;
  bool line_open_ = false;
};

// One JSON object per line (StepMetrics::to_json), flushed after each so a crashed run keeps its lines.
// Truncates the file, or appends when the run resumes (append = true).
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append);
  void write(const StepMetrics& m);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace memtrain::train::detail
