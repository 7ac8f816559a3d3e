// Optimizer tests. Every update rule is checked against a float64 reference written here from the
// published algorithm (plain loops over std::vector<double>), fed the very same f32 gradients; AdamW is
// also checked against PyTorch (tests/fixtures/adamw_torch.txt, from scripts/make_adamw_fixture.py).
// Base-class behaviour: exact state bytes (memory_stats and state_bytes), NaN/Inf skipping, state_dict
// round trips and errors, step_param from a gradient-ready hook.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "memtrain/core/allocator.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/optim/optim.h"

namespace memtrain::optim {
namespace {

using Vec = std::vector<double>;

// ---- helpers --------------------------------------------------------------------------------------------

std::vector<float> random_floats(std::mt19937& rng, std::int64_t n, double scale) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto& v : out) v = static_cast<float>(dist(rng));
  return out;
}

Tensor make_param(const std::vector<float>& values, const Shape& shape) {
  Tensor t = tensor<float>(values, shape);
  t.set_requires_grad(true);
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

Vec to_vec(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// Largest |got - want| / (abs_tol + rel_tol * |want|); <= 1 passes.
double worst_ratio(const std::vector<float>& got, const Vec& want, double abs_tol, double rel_tol) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / (abs_tol + rel_tol * std::abs(want[i])));
  return worst;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

std::size_t state_live_bytes() { return memory_stats()[MemoryCategory::optimizer_state].live_bytes; }

// ---- float64 references of the published rules ------------------------------------------------------------

struct RefAdamW {  // Loshchilov & Hutter, as torch.optim.AdamW
  double lr, wd, b1, b2, eps;
  Vec m{}, v{};
  int t = 0;
  void step(Vec& p, const Vec& g) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

struct RefSGD {  // torch.optim.SGD, dampening 0
  double lr, momentum, wd;
  bool nesterov;
  Vec buf{};
  void step(Vec& p, const Vec& g) {
    const bool first = buf.empty();
    if (first) buf.assign(p.size(), 0.0);
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      if (momentum != 0.0) {
        buf[i] = first ? d : momentum * buf[i] + d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }
};

struct RefLion {  // Chen et al. 2023, Algorithm 2
  double lr, wd, b1, b2;
  Vec m{};
  void step(Vec& p, const Vec& g) {
    if (m.empty()) m.assign(p.size(), 0.0);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double c = b1 * m[i] + (1 - b1) * g[i];
      const double s = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
      p[i] -= lr * (s + wd * p[i]);
      m[i] = b2 * m[i] + (1 - b2) * g[i];
    }
  }
};

// Shazeer & Stern 2018 (Alg. 4/5 with update clipping), relative step off, as in HF transformers.
struct RefAdafactor {
  double lr, wd, b1;  // b1 == 0: no first moment
  Shape shape;
  double decay_rate = -0.8, eps1 = 1e-30, clip = 1.0;
  Vec row{}, col{}, vec{}, m{};
  int t = 0;
  void step(Vec& p, const Vec& g) {
    ++t;
    const double b2t = 1.0 - std::pow(t, decay_rate);
    const std::size_t n = p.size();
    Vec u(n);
    if (shape.size() >= 2) {
      const std::size_t R = shape[shape.size() - 2], C = shape.back(), B = n / (R * C);
      if (row.empty()) row.assign(B * R, 0.0), col.assign(B * C, 0.0);
      for (std::size_t b = 0; b < B; ++b) {
        auto G = [&](std::size_t i, std::size_t j) { const double x = g[b * R * C + i * C + j]; return x * x + eps1; };
        for (std::size_t i = 0; i < R; ++i) {
          double s = 0;
          for (std::size_t j = 0; j < C; ++j) s += G(i, j);
          row[b * R + i] = b2t * row[b * R + i] + (1 - b2t) * s / C;
        }
        for (std::size_t j = 0; j < C; ++j) {
          double s = 0;
          for (std::size_t i = 0; i < R; ++i) s += G(i, j);
          col[b * C + j] = b2t * col[b * C + j] + (1 - b2t) * s / R;
        }
        double row_sum = 0;
        for (std::size_t i = 0; i < R; ++i) row_sum += row[b * R + i];
        for (std::size_t i = 0; i < R; ++i)
          for (std::size_t j = 0; j < C; ++j) {
            // v = r c^T / sum(r) with r, c as row/column SUMS of G = (R C means) r c^T / (R mean(r)) ...
            // ... which, written with the stored means, is row_i * col_j / mean(row).
            const double v = row[b * R + i] * col[b * C + j] / (row_sum / R);
            u[b * R * C + i * C + j] = g[b * R * C + i * C + j] / std::sqrt(v);
          }
      }
    } else {
      if (vec.empty()) vec.assign(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        vec[i] = b2t * vec[i] + (1 - b2t) * (g[i] * g[i] + eps1);
        u[i] = g[i] / std::sqrt(vec[i]);
      }
    }
    double ss = 0;
    for (double x : u) ss += x * x;
    const double denom = std::max(1.0, std::sqrt(ss / n) / clip);
    for (auto& x : u) x = x / denom * lr;
    if (b1 > 0) {
      if (m.empty()) m.assign(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) m[i] = b1 * m[i] + (1 - b1) * u[i], u[i] = m[i];
    }
    for (std::size_t i = 0; i < n; ++i) p[i] = p[i] - wd * lr * p[i] - u[i];
  }
};

// Runs `opt` and a float64 reference side by side on the same f32 gradients; returns the worst ratio of
// the error to the tolerance over all steps and parameters.
template <typename Ref>
double run_against_reference(Optimizer& opt, std::vector<Tensor>& params, std::vector<Ref>& refs, int steps,
                             double grad_scale, double abs_tol, double rel_tol, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Vec> ref_p;
  for (auto& p : params) ref_p.push_back(to_vec(values_of(p)));
  double worst = 0.0;
  for (int k = 0; k < steps; ++k) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto g = random_floats(rng, params[i].numel(), grad_scale);
      params[i].set_grad(tensor<float>(g, params[i].shape()));
      refs[i].step(ref_p[i], to_vec(g));
    }
    const StepReport report = opt.step();
    EXPECT_EQ(report.updated, static_cast<std::int64_t>(params.size()));
    for (std::size_t i = 0; i < params.size(); ++i)
      worst = std::max(worst, worst_ratio(values_of(params[i]), ref_p[i], abs_tol, rel_tol));
  }
  ::testing::Test::RecordProperty("worst_error_over_tolerance", std::to_string(worst));
  return worst;
}

std::vector<Tensor> random_params(std::uint32_t seed, const std::vector<Shape>& shapes) {
  std::mt19937 rng(seed);
  std::vector<Tensor> out;
  for (const auto& s : shapes) out.push_back(make_param(random_floats(rng, shape_numel(s), 1.0), s));
  return out;
}

// ---- update rules vs float64 references ---------------------------------------------------------------------
// Tolerances: each step rounds the parameter (|p| ~ 1, half-ulp 6e-8) and computes an update of size ~lr
// with relative error ~1e-6 (f32 moments, sqrt, divisions); over 60 steps that is < 60 * (6e-8 + 1e-8) ~
// 4e-6. We allow abs 1e-5 + rel 1e-5, i.e. a little more than twice that bound.

TEST(OptimAdamW, MatchesFloat64Reference) {
  auto params = random_params(1, {{7, 13}, {5}});
  ParamGroup g0{{params[0]}, 1e-2, 0.1, 0.9, 0.999, 1e-8};
  ParamGroup g1{{params[1]}, 3e-3, 0.0, 0.8, 0.99, 1e-6};
  AdamW opt({g0, g1});
  std::vector<RefAdamW> refs{{1e-2, 0.1, 0.9, 0.999, 1e-8}, {3e-3, 0.0, 0.8, 0.99, 1e-6}};
  EXPECT_LE(run_against_reference(opt, params, refs, 60, 0.5, 1e-5, 1e-5, 11), 1.0);
}

TEST(OptimSGD, MomentumWeightDecayMatchesReference) {
  auto params = random_params(2, {{6, 9}, {4}});
  SGD opt({ParamGroup{{params[0], params[1]}, 5e-2, 1e-2, 0.9}});
  std::vector<RefSGD> refs(2, RefSGD{5e-2, 0.9, 1e-2, false});
  // Momentum amplifies the per-step error by up to 1/(1-0.9) = 10; lr*|buf| stays ~0.5, so 1e-5 holds.
  EXPECT_LE(run_against_reference(opt, params, refs, 60, 1.0, 1e-5, 1e-5, 12), 1.0);
}

TEST(OptimSGD, NesterovMatchesReference) {
  auto params = random_params(3, {{5, 8}});
  SGD opt({ParamGroup{{params[0]}, 2e-2, 0.0, 0.8}}, /*nesterov=*/true);
  std::vector<RefSGD> refs(1, RefSGD{2e-2, 0.8, 0.0, true});
  EXPECT_LE(run_against_reference(opt, params, refs, 60, 1.0, 1e-5, 1e-5, 13), 1.0);
}

TEST(OptimSGD, PlainSgdHasNoState) {
  auto params = random_params(4, {{3, 4}});
  const std::size_t before = state_live_bytes();
  SGD opt({ParamGroup{{params[0]}, 1e-1, 1e-2, 0.0}});
  std::vector<RefSGD> refs(1, RefSGD{1e-1, 0.0, 1e-2, false});
  EXPECT_LE(run_against_reference(opt, params, refs, 50, 1.0, 1e-5, 1e-5, 14), 1.0);
  EXPECT_EQ(opt.state_bytes(), 0u);
  EXPECT_EQ(state_live_bytes() - before, 0u);
  EXPECT_THROW(SGD({ParamGroup{{params[0]}, 1e-1, 0.0, 0.0}}, true), Error);  // Nesterov without momentum
}

TEST(OptimLion, MatchesFloat64Reference) {
  auto params = random_params(5, {{8, 11}, {6}});
  Lion opt({ParamGroup{{params[0], params[1]}, 1e-3, 0.1, 0.9, 0.99}});
  std::vector<RefLion> refs(2, RefLion{1e-3, 0.1, 0.9, 0.99});
  // A sign flip between f32 and f64 (|c| below ~1e-7) would show as a 2e-3 jump; none happens on this seed.
  EXPECT_LE(run_against_reference(opt, params, refs, 60, 1.0, 1e-5, 1e-5, 15), 1.0);
}

TEST(OptimLion, ZeroGradientOnlyDecays) {
  // sign(0) = 0: with m = 0 and g = 0 the step is the weight decay alone, p * (1 - lr*wd).
  auto params = random_params(8, {{9}});
  const auto before = values_of(params[0]);
  Lion opt({ParamGroup{{params[0]}, 1e-2, 0.5, 0.9, 0.99}});
  params[0].set_grad(zeros({9}));
  opt.step();
  Vec want;
  for (float v : before) want.push_back(v * (1.0 - 1e-2 * 0.5));
  EXPECT_LE(worst_ratio(values_of(params[0]), want, 0.0, 1.2e-7), 1.0);  // one f32 rounding of the product
}

TEST(OptimAdafactor, MatchesFloat64Reference) {
  auto params = random_params(6, {{6, 10}, {7}, {2, 3, 5}});
  Adafactor opt({ParamGroup{{params[0], params[1], params[2]}, 1e-2, 1e-2}});
  std::vector<RefAdafactor> refs;
  for (auto& p : params) refs.push_back(RefAdafactor{1e-2, 1e-2, 0.0, p.shape()});
  EXPECT_LE(run_against_reference(opt, params, refs, 60, 1.0, 1e-5, 1e-5, 16), 1.0);
}

// Past 1 Mi elements the CPU step works a block of rows at a time (statistics, the update's RMS, then the update
// again to apply it): a [1100, 1000] matrix, a [2, 700, 800] batch of matrices and a [1.5 Mi] vector still follow
// the float64 reference, and a step's workspace stays at one block (4 MiB) instead of the parameter's size.
TEST(OptimAdafactor, LargeParametersStepInBlocksAndMatchFloat64Reference) {
  auto params = random_params(8, {{1100, 1000}, {2, 700, 800}, {3 << 19}});
  Adafactor opt({ParamGroup{{params[0], params[1], params[2]}, 1e-2, 1e-2, 0.9}}, AdafactorOptions{.use_first_moment = true});
  std::vector<RefAdafactor> refs;
  for (auto& p : params) refs.push_back(RefAdafactor{1e-2, 1e-2, 0.9, p.shape()});
  EXPECT_LE(run_against_reference(opt, params, refs, 3, 1.0, 1e-5, 1e-5, 18), 1.0);
  Allocator& cpu = Allocator::get(Device::cpu());
  for (auto& p : params) p.set_grad(ones(p.shape()));
  const std::size_t before = cpu.stats().by_category[static_cast<int>(MemoryCategory::workspace)].live_bytes;
  cpu.reset_peak();
  opt.step();
  EXPECT_LE(cpu.stats().by_category[static_cast<int>(MemoryCategory::workspace)].peak_bytes - before,
            std::size_t{4} << 20);
}

TEST(OptimAdafactor, FirstMomentMatchesFloat64Reference) {
  auto params = random_params(7, {{9, 4}, {3}});
  Adafactor opt({ParamGroup{{params[0], params[1]}, 1e-2, 0.0, 0.9}}, AdafactorOptions{.use_first_moment = true});
  std::vector<RefAdafactor> refs;
  for (auto& p : params) refs.push_back(RefAdafactor{1e-2, 0.0, 0.9, p.shape()});
  // Tiny gradients: u = g/sqrt(v) is scale-free, so this checks that eps1 (1e-30) stays negligible.
  EXPECT_LE(run_against_reference(opt, params, refs, 60, 1e-3, 1e-5, 1e-5, 17), 1.0);
}

// ---- AdamW vs PyTorch ---------------------------------------------------------------------------------------

TEST(OptimAdamW, MatchesTorchFixture) {
  std::ifstream in(std::string(MEMTRAIN_FIXTURES_DIR) + "/adamw_torch.txt");
  ASSERT_TRUE(in) << "missing tests/fixtures/adamw_torch.txt (scripts/make_adamw_fixture.py)";
  double lr = 0, wd0 = 0, wd1 = 0, b1 = 0, b2 = 0, eps = 0;
  int steps = 0;
  std::vector<Shape> shapes(2);
  std::vector<std::vector<float>> init(2);
  std::map<std::pair<int, int>, std::vector<float>> grads, expect;
  std::string line;
  auto floats = [](std::istringstream& ss) {
    std::vector<float> v;
    std::string tok;
    while (ss >> tok) v.push_back(std::stof(tok));
    return v;
  };
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string tag;
    ss >> tag;
    if (tag == "hyper") {
      ss >> lr >> wd0 >> wd1 >> b1 >> b2 >> eps >> steps;
    } else if (tag == "shape") {
      int i;
      ss >> i;
      std::int64_t d;
      while (ss >> d) shapes.at(i).push_back(d);
    } else if (tag == "init") {
      int i;
      ss >> i;
      init.at(i) = floats(ss);
    } else if (tag == "grad" || tag == "expect") {
      int k, i;
      ss >> k >> i;
      (tag == "grad" ? grads : expect)[{k, i}] = floats(ss);
    }
  }
  ASSERT_EQ(steps, 10);
  std::vector<Tensor> params{make_param(init[0], shapes[0]), make_param(init[1], shapes[1])};
  AdamW opt({ParamGroup{{params[0]}, lr, wd0, b1, b2, eps}, ParamGroup{{params[1]}, lr, wd1, b1, b2, eps}});
  float worst_ulps = 0;
  for (int k = 1; k <= steps; ++k) {
    for (int i = 0; i < 2; ++i) params[i].set_grad(tensor<float>(grads.at({k, i}), shapes[i]));
    opt.step();
    for (int i = 0; i < 2; ++i) {
      const auto got = values_of(params[i]);
      const auto& want = expect.at({k, i});
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t j = 0; j < got.size(); ++j) {
        // Same operation order, f32 scalars and FMAs as PyTorch's AVX2 CPU kernel: bit-identical on the machine
        // that wrote the fixture (0 ulps). 1 ulp of slack covers a PyTorch build whose kernel does not fuse.
        const float ulp = std::nextafter(std::abs(want[j]), INFINITY) - std::abs(want[j]);
        worst_ulps = std::max(worst_ulps, std::abs(got[j] - want[j]) / ulp);
        EXPECT_LE(std::abs(got[j] - want[j]), ulp) << "step " << k << " param " << i << " element " << j;
      }
    }
  }
  RecordProperty("worst_ulps", std::to_string(worst_ulps));
}

// ---- exact state bytes --------------------------------------------------------------------------------------

TEST(OptimState, ExactBytes) {
  const std::int64_t m = 33, n = 17, k = 29;  // odd sizes: nothing may be rounded up
  struct Case {
    std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)> make;
    std::size_t expected;
  };
  const std::vector<Case> cases{
      {[](std::vector<Tensor> p) { return Spec::adamw().make(p); }, 8 * (m * n + k)},
      {[](std::vector<Tensor> p) { return Spec::lion().make(p); }, 4 * (m * n + k)},
      {[](std::vector<Tensor> p) { return Spec::sgd({.momentum = 0.9}).make(p); }, 4 * (m * n + k)},
      {[](std::vector<Tensor> p) { return Spec::sgd().make(p); }, 0},
      {[](std::vector<Tensor> p) { return Spec::adafactor().make(p); }, 4 * (m + n) + 4 * k},
      {[](std::vector<Tensor> p) { return Spec::adafactor({.beta1 = 0.9}).make(p); }, 4 * (m + n) + 4 * k + 4 * (m * n + k)},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    auto params = random_params(20, {{m, n}, {k}});
    const std::size_t before = state_live_bytes();
    {
      auto opt = cases[c].make(params);
      EXPECT_EQ(opt->state_bytes(), 0u);  // lazy: nothing before the first step
      EXPECT_EQ(state_live_bytes(), before);
      for (auto& p : params) p.set_grad(full(p.shape(), 0.5));
      opt->step();
      EXPECT_EQ(opt->state_bytes(), cases[c].expected);
      EXPECT_EQ(state_live_bytes() - before, cases[c].expected);
      opt->step();  // steady state: no growth, temporaries are not state
      EXPECT_EQ(state_live_bytes() - before, cases[c].expected);
    }
    EXPECT_EQ(state_live_bytes(), before);
  }
}

// ---- non-finite gradients ----------------------------------------------------------------------------------

TEST(OptimStep, NonFiniteGradSkipsParamAndKeepsState) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    auto params = random_params(30, {{4, 5}, {6}});
    AdamW opt({ParamGroup{params, 1e-2, 0.1}});
    for (auto& p : params) p.set_grad(full(p.shape(), 0.25));
    EXPECT_EQ(opt.step().updated, 2);
    const StateDict saved = opt.state_dict();
    const Tensor p0_before = params[0].clone();

    std::vector<float> g(20, 0.1f);
    g[7] = bad;
    params[0].set_grad(tensor<float>(g, {4, 5}));
    params[1].set_grad(full({6}, 0.25));
    const StepReport report = opt.step();
    EXPECT_EQ(report.updated, 1);
    EXPECT_EQ(report.skipped_nonfinite, 1);
    EXPECT_TRUE(bit_equal(params[0], p0_before));
    const StateDict after = opt.state_dict();
    for (const char* key : {"0.step", "0.exp_avg", "0.exp_avg_sq"}) EXPECT_TRUE(bit_equal(after.at(key), saved.at(key))) << key;
    EXPECT_EQ(after.at("1.step").item(), 2.0);
    EXPECT_FALSE(opt.step_param(params[0]));
  }
  // A NaN on the very first step allocates no state.
  auto params = random_params(31, {{3, 3}});
  AdamW opt({ParamGroup{params}});
  params[0].set_grad(full({3, 3}, std::numeric_limits<double>::quiet_NaN()));
  EXPECT_EQ(opt.step().skipped_nonfinite, 1);
  EXPECT_EQ(opt.state_bytes(), 0u);
  EXPECT_EQ(opt.state_dict().at("0.step").item(), 0.0);
  // No gradient: neither updated nor counted as skipped.
  params[0].set_grad(Tensor());
  const StepReport none = opt.step();
  EXPECT_EQ(none.updated + none.skipped_nonfinite, 0);
}

// ---- state_dict ---------------------------------------------------------------------------------------------

TEST(OptimStateDict, ResumeIsBitIdentical) {
  const std::vector<Spec> specs{Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}), Spec::sgd({.lr = 1e-2, .momentum = 0.9, .nesterov = true}),
                                Spec::lion({.lr = 1e-3, .weight_decay = 0.1}), Spec::adafactor({.beta1 = 0.9})};
  const std::vector<Shape> shapes{{5, 7}, {7}};
  for (const Spec& spec : specs) {
    SCOPED_TRACE(spec.to_string());
    auto grads_at = [&](int step, std::size_t i) {
      std::mt19937 rng(1000 + 10 * step + static_cast<std::uint32_t>(i));
      return tensor<float>(random_floats(rng, shape_numel(shapes[i]), 1.0), shapes[i]);
    };
    auto run = [&](Optimizer& opt, std::vector<Tensor>& params, int from, int to) {
      for (int s = from; s < to; ++s) {
        for (std::size_t i = 0; i < params.size(); ++i) params[i].set_grad(grads_at(s, i));
        opt.step();
      }
    };
    auto straight = random_params(40, shapes);
    auto opt_a = spec.make(straight);
    run(*opt_a, straight, 0, 12);

    auto first = random_params(40, shapes);
    auto opt_b = spec.make(first);
    run(*opt_b, first, 0, 5);
    const StateDict saved = opt_b->state_dict();
    std::vector<Tensor> resumed;
    for (auto& p : first) resumed.push_back(p.clone().detach().set_requires_grad(true));
    auto opt_c = spec.make(resumed);
    opt_c->load_state_dict(saved);
    EXPECT_EQ(opt_c->state_bytes(), opt_b->state_bytes());
    run(*opt_c, resumed, 5, 12);
    for (std::size_t i = 0; i < shapes.size(); ++i) EXPECT_TRUE(bit_equal(resumed[i], straight[i])) << "param " << i;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(OptimStateDict, LoadErrorsNameTheKey) {
  auto params = random_params(50, {{3, 4}, {4}});
  AdamW opt({ParamGroup{params}});
  for (auto& p : params) p.set_grad(full(p.shape(), 0.5));
  opt.step();
  const StateDict good = opt.state_dict();
  ASSERT_EQ(good.size(), 6u);  // 2 x (step, exp_avg, exp_avg_sq)
  auto fresh_params = random_params(51, {{3, 4}, {4}});
  AdamW other({ParamGroup{fresh_params}});

  StateDict missing = good;
  missing.erase("1.exp_avg_sq");
  EXPECT_NE(error_of([&] { other.load_state_dict(missing); }).find("missing key '1.exp_avg_sq'"), std::string::npos);
  StateDict no_step = good;
  no_step.erase("0.step");
  EXPECT_NE(error_of([&] { other.load_state_dict(no_step); }).find("missing key '0.step'"), std::string::npos);

  StateDict unexpected = good;
  unexpected["2.exp_avg"] = zeros({4});
  EXPECT_NE(error_of([&] { other.load_state_dict(unexpected); }).find("unexpected key '2.exp_avg'"), std::string::npos);

  StateDict misshaped = good;
  misshaped["0.exp_avg"] = zeros({4, 3});
  const std::string msg = error_of([&] { other.load_state_dict(misshaped); });
  EXPECT_NE(msg.find("'0.exp_avg'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;

  // A failed load leaves the optimizer as it was (no state yet), and a good one then works.
  EXPECT_EQ(other.state_bytes(), 0u);
  other.load_state_dict(good);
  EXPECT_EQ(other.state_bytes(), 8u * 16);
  EXPECT_TRUE(bit_equal(other.state_dict().at("0.exp_avg"), good.at("0.exp_avg")));
}

// ---- step_param from a gradient-ready hook -------------------------------------------------------------------

TEST(OptimStepParam, GradReadyHookMatchesStep) {
  std::mt19937 rng(60);
  const auto w0 = random_floats(rng, 4 * 3, 0.5), b0 = random_floats(rng, 3, 0.5);
  const auto w1 = random_floats(rng, 3 * 2, 0.5);
  std::vector<Tensor> xs;
  for (int it = 0; it < 4; ++it) xs.push_back(tensor<float>(random_floats(rng, 5 * 4, 1.0), {5, 4}));
  auto loss_of = [](const Tensor& x, const std::vector<Tensor>& p) {
    const Tensor h = ops::tanh(ops::add(ops::matmul(x, p[0]), p[1]));
    const Tensor y = ops::matmul(h, p[2]);
    return ops::sum(ops::mul(y, y));
  };

  std::vector<Tensor> a{make_param(w0, {4, 3}), make_param(b0, {3}), make_param(w1, {3, 2})};
  auto opt_a = Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}).make(a);
  for (const Tensor& x : xs) {
    loss_of(x, a).backward();
    opt_a->step();
    opt_a->zero_grad();
  }

  std::vector<Tensor> b{make_param(w0, {4, 3}), make_param(b0, {3}), make_param(w1, {3, 2})};
  auto opt_b = Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}).make(b);
  int hook_steps = 0;
  for (auto& p : b) {
    p.register_grad_ready_hook([&](Tensor& leaf) {
      EXPECT_TRUE(opt_b->step_param(leaf));
      leaf.set_grad(Tensor());  // free the gradient as soon as it is used
      ++hook_steps;
    });
  }
  for (const Tensor& x : xs) loss_of(x, b).backward();
  EXPECT_EQ(hook_steps, 3 * 4);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(bit_equal(a[i], b[i])) << "param " << i;
    EXPECT_FALSE(b[i].grad().defined());
  }
  EXPECT_THROW(opt_b->step_param(zeros({3})), Error);  // not one of its parameters
}

// ---- Spec, groups, input checks -------------------------------------------------------------------------------

TEST(OptimSpec, DecayGroupsAndMake) {
  auto params = random_params(70, {{4, 4}, {4}, {4, 2}, {2}});
  const auto groups = decay_groups({{"fc1.weight", params[0]}, {"fc1.bias", params[1]}, {"fc2.weight", params[2]},
                                    {"ln.gain", params[3]}},
                                   3e-4, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].params.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  EXPECT_EQ(groups[1].params.size(), 2u);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  EXPECT_TRUE(groups[1].params[0].shares_storage_with(params[1]));

  auto opt = Spec::lion({.lr = 1e-4}).make(groups);
  EXPECT_EQ(opt->name(), "Lion");
  ASSERT_EQ(opt->param_groups().size(), 2u);
  EXPECT_EQ(opt->param_groups()[1].lr, 3e-4);  // groups keep their lr / weight decay ...
  EXPECT_EQ(opt->param_groups()[0].beta2, 0.99);  // ... and take the spec's betas
  EXPECT_EQ(Spec::sgd({.momentum = 0.9}).make(params)->param_groups()[0].beta1, 0.9);
  EXPECT_NE(Spec::adamw8bit().make(params), nullptr);
  EXPECT_NE(Spec::lion8bit().make(params), nullptr);
  EXPECT_NE(Spec::adamw({.lr = 3e-4}).to_string().find("lr=0.0003"), std::string::npos);
}

TEST(OptimSpec, RejectsBadInput) {
  Tensor p64 = zeros({3}, DType::f64).set_requires_grad(true);
  AdamW opt({ParamGroup{{p64}}});
  p64.set_grad(zeros({3}, DType::f64));
  const std::string msg = error_of([&] { opt.step(); });
  EXPECT_NE(msg.find("AdamW"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
  Tensor p = zeros({3}).set_requires_grad(true);
  EXPECT_THROW(AdamW({ParamGroup{{p, p}}}), Error);  // duplicate parameter
}

}  // namespace
}  // namespace memtrain::optim
