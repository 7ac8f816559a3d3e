// The memory timeline: what it records must be what the allocator saw (its peak, its last state), the Trainer
// must mark the step's phases on it, and its SVG must be well-formed XML whose stacked series add up to the
// recorded totals, with the phases and the predicted curve in it.
#include <gtest/gtest.h>

#include "memtrain/core/allocator.h"
#include "memtrain/train/predict.h"
#include "memtrain/train/timeline.h"

#include "tiny_lm.h"
#include "xml_check.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace mt = memtrain;

namespace {

using mt::Device;
using mt::test_support::attribute;
using mt::test_support::elements;
using mt::test_support::xml_problem;
using mt::train::MemoryTimeline;

std::size_t total_of(const MemoryTimeline::Live& s) {
  std::size_t t = 0;
  for (const std::size_t b : s) t += b;
  return t;
}

// The tiny GPT's second training step and an evaluation, recorded on the CPU with the Trainer's phases (the
// CPU allocator's peak reset when the recording starts); `at_stop`: its statistics when the recording stopped.
std::unique_ptr<MemoryTimeline> record_second_step(const mt::train::TrainerConfig& c, mt::MemoryStats* at_stop = nullptr) {
  const mt::train::RunInputs in = mt::test_support::inputs_for(false);
  auto model = in.make_model();
  mt::train::Trainer trainer(c, model, in.make_loss(model), in.train, in.val);
  trainer.train_step();
  mt::Allocator::get(Device::cpu()).reset_peak();
  auto timeline = std::make_unique<MemoryTimeline>(Device::cpu());
  trainer.mark_phases_on(timeline.get());
  trainer.train_step();
  trainer.evaluate();
  trainer.mark_phases_on(nullptr);
  timeline->stop();
  if (at_stop != nullptr) *at_stop = mt::Allocator::get(Device::cpu()).stats();
  return timeline;
}

TEST(MemoryTimeline, RecordsWhatTheAllocatorSawAndTheTrainersPhases) {
  mt::train::TrainerConfig c = mt::test_support::short_run_config();
  c.grad_accum = 2;
  mt::MemoryStats after;
  const std::unique_ptr<MemoryTimeline> recorded = record_second_step(c, &after);
  const MemoryTimeline& timeline = *recorded;

  ASSERT_FALSE(timeline.samples().empty());
  EXPECT_EQ(timeline.peak_total(), after.peak_bytes);
  for (int k = 0; k < mt::kNumMemoryCategories; ++k)
    EXPECT_EQ(timeline.samples().back()[k], after.by_category[k].live_bytes) << k;
  std::vector<std::string> names;
  for (const MemoryTimeline::Phase& p : timeline.phases()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"forward 1/2", "block 1/2", "block 2/2", "backward", "forward 2/2",
                                             "block 1/2", "block 2/2", "backward", "optimizer step", "eval"}));
  for (std::size_t i = 1; i < timeline.phases().size(); ++i)
    EXPECT_LE(timeline.phases()[i - 1].first_sample, timeline.phases()[i].first_sample);
  // Nothing is recorded once stopped.
  const std::size_t n = timeline.samples().size();
  (void)mt::zeros({16}, mt::DType::f32);
  EXPECT_EQ(timeline.samples().size(), n);
}

TEST(MemoryTimeline, SvgIsWellFormedAndItsSeriesAddUpToTheRecordedTotals) {
  mt::train::TrainerConfig c = mt::test_support::short_run_config();
  const mt::train::RunInputs in = mt::test_support::inputs_for(false);
  const mt::train::MemoryPrediction predicted = mt::train::predict_memory(c, in, /*record_timeline=*/true);
  ASSERT_NE(predicted.timeline, nullptr);
  const std::unique_ptr<MemoryTimeline> recorded = record_second_step(c);
  const MemoryTimeline& timeline = *recorded;
  ASSERT_LE(timeline.samples().size(), 1200u) << "this test reads every sample back; keep the step small";

  const std::string svg = mt::train::memory_timeline_svg(timeline, predicted.timeline.get(), "a <tiny> step & more");
  EXPECT_EQ(xml_problem(svg), "") << svg.substr(0, 400);
  EXPECT_NE(svg.find("a &lt;tiny&gt; step &amp; more"), std::string::npos);
  for (const char* phase : {"forward", "backward", "optimizer step", "eval"})
    EXPECT_NE(svg.find(std::string(">") + phase + "<"), std::string::npos) << phase;
  EXPECT_NE(svg.find(" MiB<"), std::string::npos) << "the axis is in MiB";

  const std::vector<std::string> group = elements(svg, "g", "id=\"series\"");
  ASSERT_EQ(group.size(), 1u);
  const double y0 = std::atof(attribute(group[0], "data-y0").c_str());
  const double per_px = std::atof(attribute(group[0], "data-bytes-per-px").c_str());
  const std::vector<std::string> series = elements(svg, "polygon", "class=\"series\"");
  ASSERT_FALSE(series.empty());
  // The top series' upper edge is the total of every sample.
  std::istringstream points(attribute(series.back(), "points"));
  const std::size_t n = timeline.samples().size();
  for (std::size_t i = 0; i < n; ++i) {
    std::string xy;
    ASSERT_TRUE(static_cast<bool>(points >> xy)) << i;
    const double y = std::atof(xy.substr(xy.find(',') + 1).c_str());
    EXPECT_NEAR((y0 - y) * per_px, static_cast<double>(total_of(timeline.samples()[i])), 0.006 * per_px) << i;
  }
  // Each category that held bytes is a series and in the legend.
  for (int k = 0; k < mt::kNumMemoryCategories; ++k) {
    bool held = false;
    for (const auto& s : timeline.samples()) held = held || s[k] > 0;
    const std::string name(mt::category_name(static_cast<mt::MemoryCategory>(k)));
    EXPECT_EQ(!elements(svg, "polygon", "data-category=\"" + name + "\"").empty(), held) << name;
    if (held) EXPECT_NE(svg.find(">" + name + "</text>"), std::string::npos) << name;
  }
  const std::vector<std::string> line = elements(svg, "polyline", "id=\"predicted\"");
  ASSERT_EQ(line.size(), 1u);
  EXPECT_EQ(attribute(line[0], "data-peak-bytes"), std::to_string(predicted.timeline->peak_total()));
}

TEST(MemoryTimeline, ALongTimelineKeepsItsPeakWhenThinned) {
  MemoryTimeline timeline(Device::meta());
  std::vector<mt::Tensor> held;
  {
    mt::CategoryGuard category(mt::MemoryCategory::activations);
    for (int i = 0; i < 3000; ++i) {
      held.push_back(mt::Tensor::empty({(i % 997) + 1}, mt::DType::f32, Device::meta()));
      if (i % 3 == 0) held.erase(held.begin());
    }
  }
  held.clear();
  timeline.stop();
  const std::string svg = mt::train::memory_timeline_svg(timeline, nullptr, "thinned");
  EXPECT_EQ(xml_problem(svg), "");
  const std::vector<std::string> group = elements(svg, "g", "id=\"series\"");
  const double y0 = std::atof(attribute(group[0], "data-y0").c_str());
  const double per_px = std::atof(attribute(group[0], "data-bytes-per-px").c_str());
  std::istringstream points(attribute(elements(svg, "polygon", "class=\"series\"").back(), "points"));
  double highest = 0.0;
  std::string xy;
  for (int i = 0; i < 1200 && points >> xy; ++i) highest = std::max(highest, (y0 - std::atof(xy.substr(xy.find(',') + 1).c_str())) * per_px);
  EXPECT_NEAR(highest, static_cast<double>(timeline.peak_total()), 0.006 * per_px);
}

TEST(MemoryTimeline, RefusesToDrawNothing) {
  MemoryTimeline timeline(Device::meta());
  timeline.stop();
  EXPECT_THROW((void)mt::train::memory_timeline_svg(timeline, nullptr, "empty"), mt::Error);
}

}  // namespace
