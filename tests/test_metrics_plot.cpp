// metrics_svg / memtrain_plot: the run's metrics drawn per panel, read back from the SVG: well-formed, one
// point per step that has the key, the validation losses as dots, and values on the scale the axis states.
#include <gtest/gtest.h>

#include "memtrain/core/error.h"
#include "memtrain/train/metrics_plot.h"
#include "memtrain/train/trainer.h"

#include "xml_check.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace mt = memtrain;

namespace {

using mt::test_support::attribute;
using mt::test_support::elements;
using mt::test_support::xml_problem;

std::vector<nlohmann::json> run_of(int steps) {
  std::vector<nlohmann::json> lines;
  for (int s = 1; s <= steps; ++s) {
    mt::train::StepMetrics m;
    m.step = s;
    m.loss = 5.0 - 0.1 * s;
    m.lr = 1e-3;
    m.tokens = 256;
    m.step_seconds = 0.01 * s;
    m.peak_bytes = static_cast<std::size_t>(s) << 20;  // s MiB
    if (s % 4 == 0) m.val_loss = 5.2 - 0.1 * s;
    lines.push_back(m.to_json());
  }
  return lines;
}

// The y values of a panel's polyline, on the panel's own scale.
std::vector<double> values(const std::string& svg, const std::string& key) {
  const std::string panel = elements(svg, "g", "data-key=\"" + key + "\"").at(0);
  const double y0 = std::atof(attribute(panel, "data-y0").c_str());
  const double top = std::atof(attribute(panel, "data-top-value").c_str());
  const double height = std::atof(attribute(panel, "data-height").c_str());
  std::vector<double> out;
  std::istringstream points(attribute(elements(svg, "polyline", "data-key=\"" + key + "\"").at(0), "points"));
  std::string xy;
  while (points >> xy) out.push_back((y0 - std::atof(xy.substr(xy.find(',') + 1).c_str())) / height * top);
  return out;
}

TEST(MetricsPlot, DrawsEachSeriesOnTheScaleItsAxisStates) {
  const auto lines = run_of(12);
  const std::string svg = mt::train::metrics_svg(lines, "run & co");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(elements(svg, "g", "class=\"panel\"").size(), 4u);
  const std::vector<double> peak = values(svg, "peak_bytes");
  ASSERT_EQ(peak.size(), 12u);
  for (int s = 1; s <= 12; ++s) EXPECT_NEAR(peak[s - 1], s, 0.01) << "MiB at step " << s;
  const std::vector<double> loss = values(svg, "loss");
  ASSERT_EQ(loss.size(), 12u);
  EXPECT_NEAR(loss.front(), 4.9, 0.01);
  EXPECT_EQ(elements(svg, "circle", "class=\"val\"").size(), 3u) << "val_loss at steps 4, 8, 12";
  EXPECT_NE(svg.find("run &amp; co"), std::string::npos);
}

TEST(MetricsPlot, ReadsTheJsonlAndNamesABadLine) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string good = (dir / "memtrain_test_metrics.jsonl").string(), bad = (dir / "memtrain_test_bad.jsonl").string();
  {
    std::ofstream out(good);
    for (const auto& l : run_of(3)) out << l.dump() << "\n";
    std::ofstream worse(bad);
    worse << run_of(1)[0].dump() << "\n{\"step\": 2, \"loss\": \n";
  }
  EXPECT_EQ(mt::train::read_metrics_jsonl(good).size(), 3u);
  try {
    (void)mt::train::read_metrics_jsonl(bad);
    ADD_FAILURE() << "a truncated line was accepted";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)mt::train::metrics_svg({nlohmann::json{{"loss", 1.0}}}, "no step"), mt::Error);
  EXPECT_THROW((void)mt::train::metrics_svg({nlohmann::json{{"step", 1}}}, "nothing to draw"), mt::Error);
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
}

}  // namespace
