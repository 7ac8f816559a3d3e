// MemoryTimeline and its SVG (memtrain/train/timeline.h). The SVG is written by hand: a few dozen elements of
// well-known structure need no library, and the file stays self-contained.
#include "memtrain/train/timeline.h"

#include "io/atomic_file.h"
#include "train/svg.h"
#include "memtrain/core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace memtrain::train {

MemoryTimeline::MemoryTimeline(Device device) : device_(device) {
  samples_.reserve(1 << 14);
  Allocator::get(device_).set_observer([this](const Live& live) {
    std::lock_guard lock(mutex_);
    samples_.push_back(live);
  });
}

MemoryTimeline::~MemoryTimeline() { stop(); }

void MemoryTimeline::stop() {
  if (!recording_) return;
  Allocator::get(device_).set_observer({});
  recording_ = false;
}

void MemoryTimeline::mark(std::string phase) {
  std::lock_guard lock(mutex_);
  phases_.push_back({std::move(phase), samples_.size()});
}

std::size_t MemoryTimeline::peak_total() const {
  std::size_t peak = 0;
  for (const Live& s : samples_) {
    std::size_t total = 0;
    for (const std::size_t b : s) total += b;
    peak = std::max(peak, total);
  }
  return peak;
}

namespace {

constexpr double kWidth = 1100, kHeight = 520, kLeft = 80, kRight = 230, kTop = 50, kBottom = 60;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr std::size_t kMaxPoints = 1200;
constexpr const char* kColors[kNumMemoryCategories] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#e15759",
                                                       "#59a14f", "#edc948", "#b07aa1", "#9c755f"};

std::size_t total_of(const MemoryTimeline::Live& s) {
  std::size_t t = 0;
  for (const std::size_t b : s) t += b;
  return t;
}

// The indices of the samples drawn: all of them, or the largest-total sample of each of kMaxPoints buckets.
std::vector<std::size_t> drawn_samples(const std::vector<MemoryTimeline::Live>& samples) {
  std::vector<std::size_t> out;
  const std::size_t n = samples.size();
  if (n <= kMaxPoints) {
    for (std::size_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (std::size_t b = 0; b < kMaxPoints; ++b) {
    const std::size_t lo = b * n / kMaxPoints, hi = (b + 1) * n / kMaxPoints;
    std::size_t best = lo;
    for (std::size_t i = lo; i < hi; ++i)
      if (total_of(samples[i]) > total_of(samples[best])) best = i;
    out.push_back(best);
  }
  return out;
}

}  // namespace

std::string memory_timeline_svg(const MemoryTimeline& measured, const MemoryTimeline* predicted,
                                const std::string& title) {
  const auto& samples = measured.samples();
  MT_CHECK(!samples.empty(), "memory_timeline_svg", "the timeline of {} recorded no allocation", measured.device().str());
  const std::size_t top_bytes = std::max<std::size_t>(
      {measured.peak_total(), predicted ? predicted->peak_total() : 0, std::size_t{1}});
  const double mib = 1024.0 * 1024.0;
  const double step = detail::tick_step(static_cast<double>(top_bytes) / mib);
  const double top_mib = std::ceil(static_cast<double>(top_bytes) / mib / step) * step;
  const double bytes_per_px = top_mib * mib / kPlotH;
  const double y0 = kTop + kPlotH;
  const auto y_of = [&](double bytes) { return y0 - bytes / bytes_per_px; };
  const std::size_t n = samples.size();
  const auto x_of = [&](std::size_t i) {
    return kLeft + (n > 1 ? static_cast<double>(i) / static_cast<double>(n - 1) : 0.5) * kPlotW;
  };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<title>{2}</title>\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{3}\" y=\"24\" font-size=\"15\">{2}</text>\n",
      kWidth, kHeight, detail::xml_escape(title), kLeft);

  // Stacked areas, categories in their enum order from the bottom.
  const std::vector<std::size_t> drawn = drawn_samples(samples);
  std::vector<double> below(drawn.size(), 0.0);
  svg += fmt::format("<g id=\"series\" data-y0=\"{}\" data-bytes-per-px=\"{}\" data-samples=\"{}\">\n", y0,
                     bytes_per_px, n);
  std::vector<int> legend;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    bool any = false;
    for (const std::size_t i : drawn) any = any || samples[i][c] > 0;
    if (!any) continue;
    legend.push_back(c);
    std::string points;
    std::vector<double> above(drawn.size());
    for (std::size_t j = 0; j < drawn.size(); ++j) {
      above[j] = below[j] + static_cast<double>(samples[drawn[j]][c]);
      points += fmt::format("{:.2f},{:.2f} ", x_of(drawn[j]), y_of(above[j]));
    }
    for (std::size_t j = drawn.size(); j-- > 0;) points += fmt::format("{:.2f},{:.2f} ", x_of(drawn[j]), y_of(below[j]));
    points.pop_back();
    svg += fmt::format("<polygon class=\"series\" data-category=\"{}\" fill=\"{}\" points=\"{}\"/>\n",
                       category_name(static_cast<MemoryCategory>(c)), kColors[c], points);
    below = std::move(above);
  }
  svg += "</g>\n";

  // Axes: MiB ticks on the left, the event count below.
  svg += "<g id=\"axes\" stroke=\"#333\">\n";
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", kLeft, kTop, y0);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>\n", kLeft, y0, kLeft + kPlotW);
  for (double v = 0.0; v <= top_mib + step / 2; v += step) {
    const double y = y_of(v * mib);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.2f}\" x2=\"{}\" y2=\"{:.2f}\" stroke=\"#ddd\"/>\n", kLeft, y,
                       kLeft + kPlotW, y);
    svg += fmt::format("<text x=\"{}\" y=\"{:.2f}\" text-anchor=\"end\" stroke=\"none\">{:g} MiB</text>\n",
                       kLeft - 6, y + 4, v);
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" stroke=\"none\">allocations and frees of {} "
                     "({} events, in order)</text>\n",
                     kLeft + kPlotW / 2, kHeight - 18, measured.device().str(), n);
  svg += "</g>\n";

  // Phases: a dashed line where each starts, its name above the plot.
  svg += "<g id=\"phases\">\n";
  for (const MemoryTimeline::Phase& p : measured.phases()) {
    const double x = x_of(std::min(p.first_sample, n - 1));
    svg += fmt::format("<line class=\"phase\" x1=\"{0:.2f}\" y1=\"{1}\" x2=\"{0:.2f}\" y2=\"{2}\" stroke=\"#555\" "
                       "stroke-dasharray=\"2 3\"/>\n<text x=\"{0:.2f}\" y=\"{3}\" font-size=\"10\" "
                       "transform=\"rotate(-30 {0:.2f} {3})\">{4}</text>\n",
                       x, kTop, y0, kTop - 4, detail::xml_escape(p.name));
  }
  svg += "</g>\n";

  // The predicted total, on the same event axis (scaled to its own count when it differs).
  if (predicted && !predicted->samples().empty()) {
    const auto& ps = predicted->samples();
    const std::vector<std::size_t> pd = drawn_samples(ps);
    std::string points;
    for (const std::size_t i : pd) {
      const double x = kLeft + (ps.size() > 1 ? static_cast<double>(i) / static_cast<double>(ps.size() - 1) : 0.5) * kPlotW;
      points += fmt::format("{:.2f},{:.2f} ", x, y_of(static_cast<double>(total_of(ps[i]))));
    }
    points.pop_back();
    svg += fmt::format("<polyline id=\"predicted\" data-peak-bytes=\"{}\" fill=\"none\" stroke=\"black\" "
                       "stroke-width=\"1.5\" stroke-dasharray=\"6 4\" points=\"{}\"/>\n",
                       predicted->peak_total(), points);
  }

  // Legend, top category first (as stacked).
  svg += "<g id=\"legend\">\n";
  double ly = kTop + 4;
  const double lx = kLeft + kPlotW + 20;
  for (auto it = legend.rbegin(); it != legend.rend(); ++it, ly += 20) {
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}"
                       "</text>\n",
                       lx, ly, kColors[*it], lx + 20, ly + 11, category_name(static_cast<MemoryCategory>(*it)));
  }
  if (predicted) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\" stroke-dasharray=\"6 4\"/>"
                       "<text x=\"{3}\" y=\"{4}\">predicted total (meta)</text>\n",
                       lx, ly + 7, lx + 14, lx + 20, ly + 11);
    ly += 20;
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\">peak {:.1f} MiB</text>\n", lx, ly + 11,
                     static_cast<double>(measured.peak_total()) / mib);
  svg += "</g>\n</svg>\n";
  return svg;
}

void write_memory_timeline_svg(const MemoryTimeline& measured, const MemoryTimeline* predicted,
                               const std::string& title, const std::string& path) {
  const std::string svg = memory_timeline_svg(measured, predicted, title);
  ::memtrain::detail::AtomicFileWriter out(path, "write_memory_timeline_svg");
  out.write(svg.data(), svg.size());
  out.commit();
}

}  // namespace memtrain::train
