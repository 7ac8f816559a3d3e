// metrics_svg and read_metrics_jsonl (memtrain/train/metrics_plot.h).
#include "memtrain/train/metrics_plot.h"

#include "io/atomic_file.h"
#include "memtrain/core/error.h"
#include "train/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>

namespace memtrain::train {

namespace {

constexpr double kWidth = 900, kPanelH = 170, kLeft = 90, kRight = 30, kTop = 40, kGap = 30;
constexpr double kPlotW = kWidth - kLeft - kRight;

struct Panel {
  const char* key;
  const char* label;
  double scale;  // the value drawn is value / scale
  const char* color;
};

constexpr Panel kPanels[] = {
    {"loss", "loss (dots: val_loss)", 1.0, "#4e79a7"},
    {"tokens_per_s", "tokens / s", 1.0, "#59a14f"},
    {"peak_bytes", "peak memory (MiB)", 1024.0 * 1024.0, "#e15759"},
    {"lr", "learning rate", 1.0, "#b07aa1"},
};

struct Point {
  double step, value;
};

std::vector<Point> series(const std::vector<nlohmann::json>& lines, const char* key, double scale) {
  std::vector<Point> out;
  for (const nlohmann::json& l : lines)
    if (l.contains(key) && l[key].is_number()) out.push_back({l["step"].get<double>(), l[key].get<double>() / scale});
  return out;
}

}  // namespace

std::string metrics_svg(const std::vector<nlohmann::json>& lines, const std::string& title) {
  const char* where = "metrics_svg";
  for (std::size_t i = 0; i < lines.size(); ++i)
    MT_CHECK(lines[i].is_object() && lines[i].contains("step") && lines[i]["step"].is_number(), where,
             "line {} has no numeric \"step\"", i + 1);
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (const nlohmann::json& l : lines) {
    first = std::min(first, l["step"].get<double>());
    last = std::max(last, l["step"].get<double>());
  }
  const double span = last > first ? last - first : 1.0;
  const auto x_of = [&](double step) { return kLeft + (step - first) / span * kPlotW; };

  std::vector<const Panel*> drawn;
  for (const Panel& p : kPanels)
    if (!series(lines, p.key, p.scale).empty()) drawn.push_back(&p);
  MT_CHECK(!drawn.empty(), where, "none of the {} lines has loss, tokens_per_s, peak_bytes or lr", lines.size());
  const double height = kTop + static_cast<double>(drawn.size()) * (kPanelH + kGap) + 20;

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<title>{2}</title>\n<rect width=\"{0}\" height=\"{1}\" "
      "fill=\"white\"/>\n<text x=\"{3}\" y=\"24\" font-size=\"15\">{2}</text>\n",
      kWidth, height, detail::xml_escape(title), kLeft);
  double top = kTop;
  for (const Panel* p : drawn) {
    const std::vector<Point> s = series(lines, p->key, p->scale);
    std::vector<Point> dots;
    if (std::string(p->key) == "loss") dots = series(lines, "val_loss", 1.0);
    double hi = 0.0;
    for (const auto& pts : {s, dots})
      for (const Point& q : pts) hi = std::max(hi, q.value);
    const double step = detail::tick_step(hi > 0 ? hi : 1.0);
    const double y_top = std::ceil((hi > 0 ? hi : 1.0) / step) * step;
    const double y0 = top + kPanelH;
    const auto y_of = [&](double v) { return y0 - v / y_top * kPanelH; };
    svg += fmt::format("<g class=\"panel\" data-key=\"{}\" data-y0=\"{}\" data-top-value=\"{}\" data-height=\"{}\">\n",
                       p->key, y0, y_top, kPanelH);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{}</text>\n", kLeft, top - 6, p->label);
    for (double v = 0.0; v <= y_top + step / 2; v += step)
      svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.2f}\" x2=\"{2}\" y2=\"{1:.2f}\" stroke=\"#ddd\"/><text x=\"{3}\" "
                         "y=\"{4:.2f}\" text-anchor=\"end\">{5:g}</text>\n",
                         kLeft, y_of(v), kLeft + kPlotW, kLeft - 6, y_of(v) + 4, v);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333\"/>\n", kLeft, top, y0);
    std::string points;
    for (const Point& q : s) points += fmt::format("{:.2f},{:.2f} ", x_of(q.step), y_of(q.value));
    points.pop_back();
    svg += fmt::format("<polyline class=\"series\" data-key=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
                       "points=\"{}\"/>\n",
                       p->key, p->color, points);
    for (const Point& q : dots)
      svg += fmt::format("<circle class=\"val\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"#f28e2b\"/>\n",
                         x_of(q.step), y_of(q.value));
    svg += "</g>\n";
    top += kPanelH + kGap;
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step ({:g} to {:g})</text>\n</svg>\n",
                     kLeft + kPlotW / 2, height - 8, first, last);
  return svg;
}

void write_metrics_svg(const std::vector<nlohmann::json>& lines, const std::string& title, const std::string& path) {
  const std::string svg = metrics_svg(lines, title);
  ::memtrain::detail::AtomicFileWriter out(path, "write_metrics_svg");
  out.write(svg.data(), svg.size());
  out.commit();
}

std::vector<nlohmann::json> read_metrics_jsonl(const std::string& path) {
  std::ifstream in(path);
  MT_CHECK(in.good(), "read_metrics_jsonl", "cannot open '{}'", path);
  std::vector<nlohmann::json> lines;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      lines.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      MT_CHECK(false, "read_metrics_jsonl", "'{}' line {} is not JSON: {}", path, n, e.what());
    }
  }
  return lines;
}

}  // namespace memtrain::train
