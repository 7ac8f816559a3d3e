// memtrain's GaLore-AdamW against the authors' galore_torch (galore-torch 1.0), both with the canonical sign
// rule on their bases (scripts/make_galore_torch_fixture.py wrote the reference trajectories, 7 steps with
// refreshes at steps 1, 4 and 7, both projection sides, weight decay 0 and 0.1, gradients with well-separated
// leading directions). With the options set as galore_torch has them (AdamW's hf epsilon form, decay after the
// update), every step's update agrees to float rounding (<= 1e-5 of the update); with memtrain's defaults
// (torch's form, decay before) to <= 3e-3, the size of those differences. On noise gradients, where Eigen and
// LAPACK pick different signs, the updates part by 110-146% without the sign rule (measured by hand:
// docs/results/galore_torch_agreement.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "memtrain/optim/galore.h"
#include "memtrain/optim/spec.h"

namespace {

using namespace memtrain;
using namespace memtrain::optim;

// The fixture's inputs, evaluated as the script evaluates them: float64 libm, rounded to f32.
Tensor weight(std::int64_t m, std::int64_t n) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) v.push_back(0.001 * std::sin(0.7 * i + 1.3 * j + 0.1));
  return from_buffer(v.data(), {m, n}, DType::f64, DType::f32);
}

// In [-0.5, 0.5): the script's hash of (i, j, t).
double noise(std::int64_t i, std::int64_t j, int t) {
  const double x = std::sin(12.9898 * static_cast<double>(i + 1) + 78.233 * static_cast<double>(j + 1) +
                            37.719 * (t + 1)) * 43758.5453;
  return x - std::floor(x) - 0.5;
}

// The script's orthonormal sine vector k at index i of a length-`size` side.
double sine(int k, std::int64_t i, std::int64_t size) {
  return std::sqrt(2.0 / static_cast<double>(size + 1)) *
         std::sin(M_PI * (k + 1) * static_cast<double>(i + 1) / static_cast<double>(size + 1));
}

// Five planted directions of well-separated strengths plus noise (the script says why), summed in its order.
Tensor gradient(std::int64_t m, std::int64_t n, int t) {
  double strengths[5];
  for (int k = 0; k < 5; ++k) strengths[k] = 8.0 / (k + 1) * (1.0 + 0.05 * std::sin(0.7 * t + k));
  std::vector<double> v;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double g = 0.0;
      for (int k = 0; k < 5; ++k) g += strengths[k] * sine(k, i, m) * sine(k, j, n);
      v.push_back(g + 0.05 * noise(i, j, t));
    }
  return from_buffer(v.data(), {m, n}, DType::f64, DType::f32);
}

// Per step: how far this step's update is from galore_torch's, max |ours - theirs| / max |theirs|, each update
// taken from its own run's weights before the step (so the rounding of earlier steps does not pile up in it).
struct Agreement {
  std::vector<double> per_step;
};

// Runs memtrain's GaLore-AdamW on one fixture case and measures it against the reference after every step.
Agreement run(const nlohmann::json& fx, const nlohmann::json& c, AdamEpsMode eps_mode, GaLoreDecayOrder order) {
  const std::int64_t m = c["m"], n = c["n"];
  const double wd = c["weight_decay"], lr = fx["lr"];
  Tensor w = weight(m, n);
  const Spec spec = Spec::adamw({.lr = lr, .weight_decay = wd, .beta1 = fx["betas"][0], .beta2 = fx["betas"][1],
                                 .eps = fx["eps"], .eps_mode = eps_mode});
  GaLoreSpec gs;
  gs.rank = fx["rank"];
  gs.update_gap = fx["update_proj_gap"];
  gs.scale = fx["scale"];
  gs.svd = GaLoreSvd::exact;  // galore_torch's: torch.linalg.svd
  gs.decay_order = order;
  GaLoreGroups groups;
  groups.projected.push_back(ParamGroup{{w}, lr, wd});
  GaLore opt(spec, gs, std::move(groups));
  Agreement a;
  std::vector<float> theirs_before(w.data<float>(), w.data<float>() + w.numel());
  for (int t = 0; t < fx["steps"].get<int>(); ++t) {
    const std::vector<float> ours_before(w.data<float>(), w.data<float>() + w.numel());
    w.set_grad(gradient(m, n, t));
    opt.step();
    const std::vector<float> theirs = c["weights_after_step"][t].get<std::vector<float>>();
    double error = 0.0, update = 0.0;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      const double ours_step = static_cast<double>(w.data<float>()[i]) - ours_before[i];
      const double their_step = static_cast<double>(theirs[i]) - theirs_before[i];
      error = std::max(error, std::abs(ours_step - their_step));
      update = std::max(update, std::abs(their_step));
    }
    a.per_step.push_back(error / update);
    theirs_before = theirs;
  }
  return a;
}

nlohmann::json fixture() {
  std::ifstream in(std::string(MEMTRAIN_FIXTURES_DIR) + "/galore_torch_adamw.json");
  return nlohmann::json::parse(in);
}

std::string describe(const nlohmann::json& c) {
  return std::to_string(c["m"].get<int>()) + "x" + std::to_string(c["n"].get<int>()) +
         " wd " + std::to_string(c["weight_decay"].get<double>());
}

// Every step of case c within `bound`, and the figures printed (the note's table); returns the agreement.
Agreement expect_every_step_within(const nlohmann::json& fx, const nlohmann::json& c, AdamEpsMode eps_mode,
                                   GaLoreDecayOrder order, double bound, const char* label) {
  const Agreement a = run(fx, c, eps_mode, order);
  std::string line;
  for (std::size_t t = 0; t < a.per_step.size(); ++t) {
    EXPECT_LE(a.per_step[t], bound) << describe(c) << ", step " << t + 1;
    line += " " + std::to_string(a.per_step[t]);
  }
  std::printf("galore_torch agreement (%s), %s, per step:%s\n", label, describe(c).c_str(), line.c_str());
  return a;
}

}  // namespace

TEST(GaLoreTorch, AgreesStepByStepWithGaloreTorchsOptions) {
  const nlohmann::json fx = fixture();
  for (const auto& c : fx["cases"])
    expect_every_step_within(fx, c, AdamEpsMode::hf, GaLoreDecayOrder::after, 1e-5, "hf, after");
}

TEST(GaLoreTorch, AgreesWithinTheFormsDifferenceWithMemtrainsDefaults) {
  const nlohmann::json fx = fixture();
  for (const auto& c : fx["cases"]) {
    const Agreement a =
        expect_every_step_within(fx, c, AdamEpsMode::torch, GaLoreDecayOrder::before, 3e-3, "defaults");
    // The forms do differ: a test of agreement between equal runs would show nothing.
    EXPECT_GT(*std::max_element(a.per_step.begin(), a.per_step.end()), 1e-6) << describe(c);
  }
}
