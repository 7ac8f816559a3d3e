// Delayed FP8 scaling (amp/fp8.h, Fp8TensorMeta) against Transformer Engine's rule. The reference is
// scripts/fp8_delayed_scaling_reference.py: TE's PyTorch update written in float32 torch ops, run on one
// amax sequence for every (format, history length, margin, algorithm) case, stored as f32 bit patterns in
// tests/fixtures/fp8_delayed_scaling.json. Both sides do the same f32 operations (one division for
// fp8_max / amax, an exact one by 2^margin, 1 / scale), so they are compared bit for bit.
#include "memtrain/amp/fp8.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using amp::AmaxAlgorithm;
using amp::DelayedScalingOptions;
using amp::Fp8Format;
using amp::Fp8TensorMeta;
using nlohmann::json;

std::uint32_t bits_of(float v) { return std::bit_cast<std::uint32_t>(v); }
float from_hex(const std::string& s) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(std::stoul(s, nullptr, 16)));
}

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Fp8DelayedScaling, MatchesTransformerEngineReference) {
  std::ifstream in(std::string(MEMTRAIN_FIXTURES_DIR) + "/fp8_delayed_scaling.json");
  ASSERT_TRUE(in) << "missing fixture; run /usr/bin/python3 scripts/fp8_delayed_scaling_reference.py";
  const json fixture = json::parse(in);
  std::vector<float> amaxes;
  for (const auto& a : fixture.at("amax")) amaxes.push_back(from_hex(a.get<std::string>()));
  ASSERT_GT(amaxes.size(), 64u);
  int cases = 0;
  for (const auto& c : fixture.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    const Fp8Format format = c.at("format").get<std::string>() == "e4m3" ? Fp8Format::e4m3 : Fp8Format::e5m2;
    DelayedScalingOptions opts;
    opts.history_len = c.at("history_len").get<int>();
    opts.margin = c.at("margin").get<int>();
    opts.algo = c.at("algo").get<std::string>() == "max" ? AmaxAlgorithm::max : AmaxAlgorithm::most_recent;
    Fp8TensorMeta meta(format, opts);
    const auto& steps = c.at("steps");
    ASSERT_EQ(steps.size(), amaxes.size()) << name;
    for (std::size_t k = 0; k < amaxes.size(); ++k) {
      meta.record_amax(amaxes[k]);
      meta.update_scale();
      const float want_scale = from_hex(steps[k][0].get<std::string>());
      const float want_inv = from_hex(steps[k][1].get<std::string>());
      ASSERT_EQ(bits_of(meta.scale()), bits_of(want_scale))
          << name << " step " << k << " (amax " << amaxes[k] << "): scale " << meta.scale() << ", want " << want_scale;
      ASSERT_EQ(bits_of(meta.inv_scale()), bits_of(want_inv)) << name << " step " << k;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 16);
}

// The window is exactly history_len steps: a spike sets the scale for history_len updates (the step
// that records it and the history_len - 1 after), then rolls out. Reference values in double.
TEST(Fp8DelayedScaling, SpikeStaysInTheWindowForHistoryLenSteps) {
  for (const int len : {1, 3, 16}) {
    Fp8TensorMeta meta(Fp8Format::e4m3, {.history_len = len});
    meta.record_amax(100.0f);
    meta.update_scale();
    EXPECT_EQ(meta.scale(), static_cast<float>(448.0 / 100.0));
    for (int step = 1; step < len + 3; ++step) {
      meta.record_amax(2.0f);
      meta.update_scale();
      const double want = step < len ? 448.0 / 100.0 : 448.0 / 2.0;
      EXPECT_EQ(meta.scale(), static_cast<float>(want)) << "len " << len << " step " << step;
    }
  }
}

// TE's timing: a step quantizes with the scale from before it; its amax only moves the scale at
// update_scale(), after the step.
TEST(Fp8DelayedScaling, ScaleChangesOnlyAtUpdate) {
  Fp8TensorMeta meta(Fp8Format::e5m2, {.history_len = 4, .margin = 1});
  EXPECT_EQ(meta.scale(), 1.0f);
  EXPECT_EQ(meta.inv_scale(), 1.0f);
  meta.record_amax(7.0f);
  EXPECT_EQ(meta.scale(), 1.0f);
  meta.update_scale();
  EXPECT_EQ(meta.scale(), static_cast<float>(57344.0 / 7.0 / 2.0));
  EXPECT_EQ(meta.inv_scale(), 1.0f / meta.scale());
}

TEST(Fp8DelayedScaling, HistoryRingOldestFirstAndSlotKeepsTheMax) {
  Fp8TensorMeta meta(Fp8Format::e4m3, {.history_len = 3});
  EXPECT_EQ(meta.amax_history(), (std::vector<float>{0, 0, 0}));
  meta.record_amax(1.0f);
  meta.record_amax(0.5f);  // same step, smaller: the slot keeps 1
  EXPECT_EQ(meta.amax_history(), (std::vector<float>{0, 0, 1}));
  meta.update_scale();
  meta.record_amax(2.0f);
  meta.update_scale();
  meta.record_amax(3.0f);
  meta.record_amax(4.0f);
  EXPECT_EQ(meta.amax_history(), (std::vector<float>{1, 2, 4}));
  meta.update_scale();
  EXPECT_EQ(meta.amax_history(), (std::vector<float>{2, 4, 0}));
  // NaN sticks in its slot whatever is recorded after it in the step.
  meta.record_amax(std::numeric_limits<float>::quiet_NaN());
  meta.record_amax(5.0f);
  EXPECT_TRUE(std::isnan(meta.amax_history().back()));
}

TEST(Fp8DelayedScaling, StateIsSmallAndSized) {
  EXPECT_EQ(DelayedScalingOptions{}.history_len, 16);
  EXPECT_EQ(Fp8TensorMeta(Fp8Format::e4m3).bytes(), 16u * 4u + 8u);
  EXPECT_EQ(Fp8TensorMeta(Fp8Format::e4m3, {.history_len = 1024}).bytes(), 4104u);
  EXPECT_EQ(Fp8TensorMeta(Fp8Format::e5m2, {.history_len = 1}).bytes(), 12u);
  EXPECT_EQ(Fp8TensorMeta(Fp8Format::e5m2, {.history_len = 5}).amax_history().size(), 5u);
}

TEST(Fp8DelayedScaling, FormatsAndBadOptions) {
  EXPECT_EQ(amp::fp8_dtype(Fp8Format::e4m3), DType::f8_e4m3);
  EXPECT_EQ(amp::fp8_dtype(Fp8Format::e5m2), DType::f8_e5m2);
  EXPECT_EQ(amp::fp8_max(Fp8Format::e4m3), 448.0f);
  EXPECT_EQ(amp::fp8_max(Fp8Format::e5m2), 57344.0f);
  const std::string len0 = error_of([] { Fp8TensorMeta(Fp8Format::e4m3, {.history_len = 0}); });
  EXPECT_NE(len0.find("amp::Fp8TensorMeta"), std::string::npos) << len0;
  EXPECT_NE(len0.find("history_len"), std::string::npos) << len0;
  const std::string margin = error_of([] { Fp8TensorMeta(Fp8Format::e4m3, {.margin = -1}); });
  EXPECT_NE(margin.find("margin"), std::string::npos) << margin;
  Fp8TensorMeta meta(Fp8Format::e4m3);
  const std::string neg = error_of([&] { meta.record_amax(-1.0f); });
  EXPECT_NE(neg.find("record_amax"), std::string::npos) << neg;
  EXPECT_NE(neg.find(">= 0"), std::string::npos) << neg;
}

}  // namespace
}  // namespace memtrain
