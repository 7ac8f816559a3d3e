// Progress line and metrics JSONL.
#include "train/progress.h"

#include "memtrain/core/error.h"

#include <fmt/format.h>

#include <cmath>

namespace memtrain::train {

nlohmann::json StepMetrics::to_json() const {
  nlohmann::json j = {
      {"step", step},
      {"loss", loss},
      {"lr", lr},
      {"grad_norm", grad_norm},
      {"samples", samples},
      {"tokens", tokens},
      {"step_seconds", step_seconds},
      {"tokens_per_s", step_seconds > 0.0 ? static_cast<double>(tokens) / step_seconds : 0.0},
      {"peak_bytes", peak_bytes},
      {"skipped", skipped},
  };
  if (val_loss) j["val_loss"] = *val_loss;
  if (loss_scale) j["loss_scale"] = *loss_scale;
  if (!lisa_blocks.empty()) j["lisa_blocks"] = lisa_blocks;
  if (grad_bytes_sent) j["grad_bytes_sent"] = *grad_bytes_sent;
  if (grad_bytes_dense) j["grad_bytes_dense"] = *grad_bytes_dense;
  return j;
}

namespace detail {

std::string format_bytes(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0.0) return "?";
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_rate(double per_second) {
  if (per_second >= 1e6) return fmt::format("{:.2f}M", per_second / 1e6);
  if (per_second >= 1e3) return fmt::format("{:.1f}k", per_second / 1e3);
  return fmt::format("{:.1f}", per_second);
}

std::string progress_line(const StepMetrics& m, std::int64_t max_steps, double eta_seconds) {
  const double rate = m.step_seconds > 0.0 ? static_cast<double>(m.tokens) / m.step_seconds : 0.0;
  std::string line = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {} {} | peak {} | ETA {}",
                                 m.step, max_steps, m.loss, m.lr, m.grad_norm, format_rate(rate),
                                 m.tokens == m.samples ? "samples/s" : "tok/s", format_bytes(m.peak_bytes),
                                 format_duration(eta_seconds));
  if (m.val_loss) line += fmt::format(" | val {:.4f}", *m.val_loss);
  return line;
}

ProgressPrinter::ProgressPrinter(std::int64_t max_steps, std::int64_t log_interval, bool live, std::FILE* out)
    : max_steps_(max_steps), log_interval_(log_interval), live_(live), out_(out) {}

ProgressPrinter::~ProgressPrinter() { finish(); }

void ProgressPrinter::update(const StepMetrics& m, double eta_seconds) {
  const std::string line = progress_line(m, max_steps_, eta_seconds);
  if (live_) {
    // "\033[K" clears what a longer previous line left behind.
    std::fprintf(out_, "\r%s\033[K", line.c_str());
    line_open_ = true;
    if (m.val_loss || m.step >= max_steps_) finish();
  } else if (m.step % log_interval_ == 0 || m.step >= max_steps_ || m.val_loss) {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (line_open_) {
    std::fputc('\n', out_);
    std::fflush(out_);
    line_open_ = false;
  }
}

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  MT_CHECK(out_.good(), "Trainer", "cannot open metrics file '{}' for writing", path);
}

void MetricsWriter::write(const StepMetrics& m) {
  out_ << m.to_json().dump() << '\n';
  out_.flush();
  MT_CHECK(out_.good(), "Trainer", "writing metrics file '{}' failed", path_);
}

}  // namespace detail
}  // namespace memtrain::train
