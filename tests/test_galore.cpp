// GaLore optimizer wrapper. The update is checked against a float64 reference written here (R = P^T G etc.
// recomputed in double from the basis the projector holds after each step, AdamW / Lion on R in double,
// back-projection and decoupled decay), for every projection type and both m < n and m > n, over several
// refreshes. Other bases must reduce a least-squares loss; state bytes are checked exactly (and against the
// allocator's optimizer_state count); the refresh schedule, bit-identical resume from a state_dict, NaN
// skipping, refusals, plain groups matching the base bit for bit and the default parameter split are checked
// too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "memtrain/core/allocator.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/optim/galore.h"

namespace memtrain::optim {
namespace {

// A row-major float64 matrix with the few operations the references need (plain loops, no Eigen: the tests
// are built without the library's -march=native, and Eigen's inline allocation must not mix the two).
struct MatD {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> a;
  MatD() = default;
  MatD(std::int64_t r, std::int64_t c) : rows(r), cols(c), a(static_cast<std::size_t>(r * c), 0.0) {}
  std::int64_t size() const { return rows * cols; }
  double& operator()(std::int64_t i) { return a[static_cast<std::size_t>(i)]; }
  double operator()(std::int64_t i) const { return a[static_cast<std::size_t>(i)]; }
  double& operator()(std::int64_t i, std::int64_t j) { return a[static_cast<std::size_t>(i * cols + j)]; }
  double operator()(std::int64_t i, std::int64_t j) const { return a[static_cast<std::size_t>(i * cols + j)]; }
};

MatD operator*(const MatD& x, const MatD& y) {
  MatD out(x.rows, y.cols);
  for (std::int64_t i = 0; i < x.rows; ++i)
    for (std::int64_t k = 0; k < x.cols; ++k)
      for (std::int64_t j = 0; j < y.cols; ++j) out(i, j) += x(i, k) * y(k, j);
  return out;
}

MatD transpose(const MatD& x) {
  MatD out(x.cols, x.rows);
  for (std::int64_t i = 0; i < x.rows; ++i)
    for (std::int64_t j = 0; j < x.cols; ++j) out(j, i) = x(i, j);
  return out;
}

const GaLoreProjType kTypes[] = {GaLoreProjType::std_side, GaLoreProjType::reverse_std_side, GaLoreProjType::left,
                                 GaLoreProjType::right, GaLoreProjType::full};

MatD to_mat(const Tensor& t) {
  const Tensor c = t.contiguous();
  MatD out(c.size(0), c.size(1));
  for (std::int64_t i = 0; i < out.size(); ++i) out(i) = c.data<float>()[i];
  return out;
}

Tensor to_tensor(const MatD& x) {
  Tensor t = Tensor::empty({x.rows, x.cols}, DType::f32);
  for (std::int64_t i = 0; i < x.size(); ++i) t.data<float>()[i] = static_cast<float>(x(i));
  return t;
}

Tensor random_tensor(std::mt19937& gen, const Shape& shape, double scale) {
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = static_cast<float>(nd(gen));
  return tensor<float>(v, shape);
}

Tensor random_param(std::uint32_t seed, const Shape& shape) {
  std::mt19937 gen(seed);
  Tensor t = random_tensor(gen, shape, 1.0);
  t.set_requires_grad(true);
  return t;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

std::size_t state_live_bytes() { return memory_stats()[MemoryCategory::optimizer_state].live_bytes; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

GaLoreGroups projected_only(std::vector<Tensor> params, double lr, double wd) {
  GaLoreGroups g;
  g.projected.push_back(ParamGroup{std::move(params), lr, wd});
  return g;
}

// ---- float64 reference ------------------------------------------------------------------------------------

// The rule on the projected gradient R, returning D = the update the base adds (R's shape).
struct RefRule {
  bool lion = false;
  double lr, b1, b2, eps;
  MatD m, v;
  int t = 0;
  MatD step(const MatD& R) {
    if (m.size() == 0) m = MatD(R.rows, R.cols), v = MatD(R.rows, R.cols);
    ++t;
    MatD D(R.rows, R.cols);
    if (lion) {  // Chen et al.: sign of the interpolation, then the moment update
      for (std::int64_t i = 0; i < R.size(); ++i) {
        const double c = b1 * m(i) + (1 - b1) * R(i);
        D(i) = -lr * static_cast<double>((c > 0) - (c < 0));
        m(i) = b2 * m(i) + (1 - b2) * R(i);
      }
      return D;
    }
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);  // Adam with bias correction
    for (std::int64_t i = 0; i < R.size(); ++i) {
      m(i) = b1 * m(i) + (1 - b1) * R(i);
      v(i) = b2 * v(i) + (1 - b2) * R(i) * R(i);
      D(i) = -lr / bc1 * m(i) / (std::sqrt(v(i)) / std::sqrt(bc2) + eps);
    }
    return D;
  }
};

// With the full projection, R = P^T G Q at a refresh is diag(singular values) up to rounding; on the first
// step (zero moments) Adam and Lion would turn that rounding noise (1e-7 in f32, 1e-16 here) into full-size
// +-lr updates of opposite signs. So that first gradient is diagonal, whose singular vectors are exact unit
// vectors in both precisions; later refreshes meet moments of order 0.1, where the noise cannot matter.
Tensor diagonal_gradient(const Shape& shape) {
  MatD g(shape[0], shape[1]);
  for (std::int64_t i = 0; i < std::min(shape[0], shape[1]); ++i) g(i, i) = 3.0 - 0.5 * static_cast<double>(i);
  return to_tensor(g);
}

// Tolerance: every step rounds R (f32 matmuls, relative ~1e-6 of |R|), the f32 moments and the parameter
// (|p| ~ 1, half-ulp 6e-8); over 10 steps with updates ~lr that stays below ~2e-6. We allow 1e-5 relative
// plus 1e-6 absolute.
TEST(GaLoreUpdate, MatchesFloat64ReferenceForEveryProjType) {
  const std::int64_t rank = 3;
  const int steps = 10;
  const double wd = 0.1, scale = 0.25;
  struct Base {
    Spec spec;
    bool lion;
  };
  const Base bases[] = {{Spec::adamw({.lr = 1e-2, .weight_decay = wd}), false},
                        {Spec::lion({.lr = 1e-3, .weight_decay = wd}), true}};
  for (const Base& base : bases) {
    for (const GaLoreProjType type : kTypes) {
      for (const Shape& shape : {Shape{6, 10}, Shape{10, 6}}) {
        SCOPED_TRACE(base.spec.to_string() + " " + galore_proj_type_name(type) + " " + shape_str(shape));
        Tensor w = random_param(7, shape);
        const GaLoreSpec gs{.rank = rank, .update_gap = 3, .scale = scale, .proj_type = type,
                            .svd = GaLoreSvd::exact};
        GaLore opt(base.spec, gs, projected_only({w}, base.spec.lr, wd));
        MatD p = to_mat(w);
        RefRule ref{base.lion, base.spec.lr, base.spec.beta1, base.spec.beta2, base.spec.eps, {}, {}, 0};
        std::mt19937 gen(99);
        for (int s = 0; s < steps; ++s) {
          Tensor G = random_tensor(gen, shape, 1.0);
          if (s == 0 && type == GaLoreProjType::full) G = diagonal_gradient(shape);
          w.set_grad(G);
          ASSERT_EQ(opt.step().updated, 1);
          // The basis used this step is the one the projector holds now (refreshed or not).
          const GaLoreProjector& proj = *opt.projector(w);
          const MatD g = to_mat(G);
          MatD back;
          switch (proj.side()) {
            case GaLoreProjector::Side::left: {
              const MatD P = to_mat(proj.left_matrix());
              back = P * ref.step(transpose(P) * g);
              break;
            }
            case GaLoreProjector::Side::right: {
              const MatD Q = to_mat(proj.right_matrix());
              back = ref.step(g * Q) * transpose(Q);
              break;
            }
            default: {
              const MatD P = to_mat(proj.left_matrix()), Q = to_mat(proj.right_matrix());
              back = P * ref.step(transpose(P) * g * Q) * transpose(Q);
              break;
            }
          }
          for (std::int64_t i = 0; i < p.size(); ++i) p(i) = p(i) * (1 - base.spec.lr * wd) + scale * back(i);
        }
        const MatD got = to_mat(w);
        double worst = 0.0;
        for (std::int64_t i = 0; i < p.size(); ++i)
          worst = std::max(worst, std::abs(got(i) - p(i)) / (1e-6 + 1e-5 * std::abs(p(i))));
        EXPECT_LE(worst, 1.0);
        EXPECT_EQ(opt.projector(w)->refresh_count(), 4);  // t = 0, 3, 6, 9
      }
    }
  }
}

// ---- other bases ------------------------------------------------------------------------------------------

// 0.5 * mean over the batch of |W x - y|^2 with y = W* x; returns the loss and sets W's gradient.
struct LeastSquares {
  MatD X, Y;
  LeastSquares(std::int64_t m, std::int64_t n, std::int64_t batch, std::mt19937& gen) : X(n, batch) {
    std::normal_distribution<double> nd;
    MatD target(m, n);
    for (std::int64_t i = 0; i < X.size(); ++i) X(i) = nd(gen);
    for (std::int64_t i = 0; i < target.size(); ++i) target(i) = nd(gen);
    Y = target * X;
  }
  double loss_and_grad(Tensor& w) const {
    MatD E = to_mat(w) * X;
    double sq = 0.0;
    for (std::int64_t i = 0; i < E.size(); ++i) {
      E(i) -= Y(i);
      sq += E(i) * E(i);
    }
    MatD G = E * transpose(X);
    for (double& x : G.a) x /= static_cast<double>(X.cols);
    w.set_grad(to_tensor(G));
    return 0.5 * sq / static_cast<double>(X.cols);
  }
};

TEST(GaLoreBases, EveryBaseReducesALeastSquaresLoss) {
  const std::int64_t m = 16, n = 64, r = 4;
  struct Case {
    Spec spec;
    std::size_t projected_state;  // exact bytes of the base state of R (r x n)
  };
  const std::int64_t rn = r * n;  // 256 elements: one 8-bit block
  const std::vector<Case> cases{
      {Spec::sgd({.lr = 2e-2, .momentum = 0.9}), static_cast<std::size_t>(4 * rn)},
      {Spec::adamw({.lr = 0.3, .weight_decay = 0.0}), static_cast<std::size_t>(8 * rn)},
      {Spec::adamw8bit({.lr = 0.3, .weight_decay = 0.0, .min_8bit_size = 64}),
       static_cast<std::size_t>(2 * rn + 8 * ((rn + 255) / 256))},
      {Spec::lion8bit({.lr = 0.2, .min_8bit_size = 64}), static_cast<std::size_t>(rn + 4 * ((rn + 255) / 256))},
      {Spec::adafactor({.lr = 0.3}), static_cast<std::size_t>(4 * (r + n))},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.to_string());
    std::mt19937 gen(5);
    const LeastSquares problem(m, n, 128, gen);
    Tensor w = random_param(11, {m, n});
    GaLore opt(c.spec, {.rank = r, .update_gap = 20, .scale = 0.25}, projected_only({w}, c.spec.lr, 0.0));
    const double initial = problem.loss_and_grad(w);
    double loss = initial;
    for (int s = 0; s < 100; ++s) {
      opt.step();
      loss = problem.loss_and_grad(w);
    }
    RecordProperty("loss_ratio_" + std::string(kind_name(c.spec.kind)), std::to_string(loss / initial));
    EXPECT_LT(loss, 0.5 * initial) << "initial " << initial;
    EXPECT_EQ(opt.projected_state_bytes(), c.projected_state);
    EXPECT_EQ(opt.projector_bytes(), static_cast<std::size_t>(4 * m * r));
  }
}

// ---- state bytes -----------------------------------------------------------------------------------------

TEST(GaLoreState, ExactBytes) {
  const std::int64_t r = 4, k = 13;
  for (const Shape& shape : {Shape{12, 40}, Shape{40, 12}}) {
    SCOPED_TRACE(shape_str(shape));
    const std::int64_t big = std::max(shape[0], shape[1]), small = std::min(shape[0], shape[1]);
    Tensor w = random_param(1, shape), bias = random_param(2, {k});
    GaLoreGroups groups = projected_only({w}, 1e-2, 0.1);
    groups.plain.push_back(ParamGroup{{bias}, 1e-2, 0.0});
    const std::size_t before = state_live_bytes();
    {
      GaLore opt(Spec::adamw(), {.rank = r, .update_gap = 2}, std::move(groups));
      EXPECT_EQ(opt.state_bytes(), 0u);  // lazy: nothing before the first step
      const std::size_t projected = 2 * 4 * r * big, projector = 4 * small * r, plain = 8 * k;
      std::mt19937 gen(3);
      for (int s = 0; s < 3; ++s) {  // steps 0 and 2 refresh: the old basis must be released
        w.set_grad(random_tensor(gen, shape, 1.0));
        bias.set_grad(random_tensor(gen, {k}, 1.0));
        opt.step();
        EXPECT_EQ(opt.projected_state_bytes(), projected);
        EXPECT_EQ(opt.projector_bytes(), projector);
        EXPECT_EQ(opt.plain_state_bytes(), plain);
        EXPECT_EQ(opt.state_bytes(), projected + projector + plain);
        EXPECT_EQ(state_live_bytes() - before, projected + projector + plain);  // workspace is not state
      }
    }
    EXPECT_EQ(state_live_bytes(), before);
  }
}

// ---- refresh schedule ------------------------------------------------------------------------------------

TEST(GaLoreRefresh, EveryUpdateGapSteps) {
  Tensor w = random_param(4, {8, 20});
  GaLore opt(Spec::adamw(), {.rank = 2, .update_gap = 3}, projected_only({w}, 1e-3, 0.0));
  std::mt19937 gen(8);
  for (int k = 1; k <= 10; ++k) {
    w.set_grad(random_tensor(gen, {8, 20}, 1.0));
    opt.step();
    const GaLoreProjector& proj = *opt.projector(w);
    EXPECT_EQ(proj.refresh_count(), (k + 2) / 3) << "after " << k << " steps";  // ceil(k / 3)
    EXPECT_EQ(proj.refreshed_last(), (k - 1) % 3 == 0) << "step " << k;
  }
}

// ---- state_dict -------------------------------------------------------------------------------------------

TEST(GaLoreStateDict, ResumeIsBitIdentical) {
  const std::vector<Shape> shapes{{10, 24}, {24, 10}, {7}};
  // The randomized SVD with warm start draws from each projector's Philox stream at every refresh. AdamW
  // runs with both bases (full), Lion8bit with 8-bit state of R (std: 3 x 24 and 10 x 3 >= 16 elements).
  struct Case {
    Spec spec;
    GaLoreProjType type;
  };
  const std::vector<Case> cases{{Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}), GaLoreProjType::full},
                                {Spec::lion8bit({.lr = 1e-3, .weight_decay = 0.1, .min_8bit_size = 16}),
                                 GaLoreProjType::std_side}};
  GaLoreSpec gs{.rank = 3, .update_gap = 3, .scale = 0.25};
  auto make = [&](const Spec& spec, std::vector<Tensor>& params) {
    GaLoreGroups g = projected_only({params[0], params[1]}, spec.lr, spec.weight_decay);
    g.plain.push_back(ParamGroup{{params[2]}, spec.lr, 0.0});
    return std::make_unique<GaLore>(spec, gs, std::move(g));
  };
  auto fresh_params = [&] {
    std::vector<Tensor> p;
    for (std::size_t i = 0; i < shapes.size(); ++i) p.push_back(random_param(20 + static_cast<std::uint32_t>(i), shapes[i]));
    return p;
  };
  auto run = [&](Optimizer& opt, std::vector<Tensor>& params, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        std::mt19937 gen(1000 + 10 * static_cast<std::uint32_t>(s) + static_cast<std::uint32_t>(i));
        params[i].set_grad(random_tensor(gen, shapes[i], 1.0));
      }
      opt.step();
    }
  };
  for (const auto& [spec, type] : cases) {
    gs.proj_type = type;
    // Saved after 4 steps (between refreshes at t = 3 and 6) and after 6 (the next step refreshes).
    for (const int split : {4, 6}) {
      SCOPED_TRACE(spec.to_string() + " split " + std::to_string(split));
      auto straight = fresh_params();
      auto opt_a = make(spec, straight);
      run(*opt_a, straight, 0, 11);

      auto first = fresh_params();
      auto opt_b = make(spec, first);
      run(*opt_b, first, 0, split);
      const StateDict saved = opt_b->state_dict();
      EXPECT_EQ(saved.count("0.galore.rng") + saved.count("1.galore.refresh_count"), 2u);
      std::vector<Tensor> resumed;
      for (auto& p : first) resumed.push_back(p.clone().detach().set_requires_grad(true));
      auto opt_c = make(spec, resumed);
      opt_c->load_state_dict(saved);
      EXPECT_EQ(opt_c->state_bytes(), opt_b->state_bytes());
      run(*opt_c, resumed, split, 11);
      for (std::size_t i = 0; i < shapes.size(); ++i) EXPECT_TRUE(bit_equal(resumed[i], straight[i])) << "param " << i;
    }
  }
}

TEST(GaLoreStateDict, LoadErrorsNameTheKey) {
  Tensor w = random_param(3, {6, 9});
  GaLore opt(Spec::adamw(), {.rank = 2, .update_gap = 3}, projected_only({w}, 1e-3, 0.0));
  w.set_grad(full({6, 9}, 0.5));
  opt.step();
  StateDict saved = opt.state_dict();
  EXPECT_EQ(saved.at("0.exp_avg").shape(), Shape({2, 9}));  // the base state has R's shape

  StateDict missing = saved;
  missing.erase("0.galore.rng");
  EXPECT_NE(error_of([&] { opt.load_state_dict(missing); }).find("missing key '0.galore.rng'"), std::string::npos);
  StateDict stray = saved;
  stray.emplace("0.galore.right", full({9, 2}, 0.0));  // a left-side projector keeps no right basis
  EXPECT_NE(error_of([&] { opt.load_state_dict(stray); }).find("unexpected key '0.galore.right'"), std::string::npos);
  StateDict bad_shape = saved;
  bad_shape["0.exp_avg"] = full({6, 9}, 0.0);
  EXPECT_NE(error_of([&] { opt.load_state_dict(bad_shape); }).find("key '0.exp_avg' has shape [6, 9]"),
            std::string::npos);
}

// ---- non-finite gradients and refusals -------------------------------------------------------------------

TEST(GaLoreStep, NonFiniteGradSkipsParamUntouched) {
  Tensor w = random_param(6, {5, 8});
  GaLore opt(Spec::adamw({.weight_decay = 0.1}), {.rank = 2, .update_gap = 1}, projected_only({w}, 1e-2, 0.1));
  w.set_grad(full({5, 8}, 0.25));
  EXPECT_EQ(opt.step().updated, 1);
  const Tensor before = w.clone();
  const StateDict saved = opt.state_dict();
  std::vector<float> g(40, 0.1f);
  g[13] = std::numeric_limits<float>::quiet_NaN();
  w.set_grad(tensor<float>(g, {5, 8}));
  const StepReport report = opt.step();
  EXPECT_EQ(report.updated, 0);
  EXPECT_EQ(report.skipped_nonfinite, 1);
  EXPECT_TRUE(bit_equal(w, before));
  EXPECT_EQ(opt.projector(w)->refresh_count(), 1);  // update_gap 1 would have refreshed
  const StateDict after = opt.state_dict();
  ASSERT_EQ(after.size(), saved.size());
  for (const auto& [key, t] : saved) EXPECT_TRUE(bit_equal(after.at(key), t)) << key;
}

TEST(GaLoreStep, RefusesWhatItCannotProject) {
  Tensor vec = random_param(1, {8}), w = random_param(2, {4, 9});
  EXPECT_NE(error_of([&] { GaLore(Spec::adamw(), {.rank = 2}, projected_only({vec}, 1e-3, 0.0)); })
                .find("GaLore: projected param 0 must be a 2-D weight, got shape [8]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { GaLore(Spec::adamw(), {.rank = 5}, projected_only({w}, 1e-3, 0.0)); })
                .find("rank 5 exceeds min(m, n) = 4 of projected param 0 (shape [4, 9])"),
            std::string::npos);
  EXPECT_NE(error_of([&] { GaLore(Spec::adamw(), {.rank = 2, .update_gap = 0}, projected_only({w}, 1e-3, 0.0)); })
                .find("update_gap must be positive"),
            std::string::npos);
}

// Plain groups are stepped by the base rule itself: the same bits and the same state_dict as the base.
TEST(GaLorePlain, MatchesTheBaseOptimizerBitForBit) {
  for (const Spec& spec : {Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}), Spec::sgd({.lr = 1e-2, .momentum = 0.9})}) {
    SCOPED_TRACE(spec.to_string());
    std::vector<Tensor> a{random_param(1, {5, 7}), random_param(2, {7})};
    std::vector<Tensor> b{random_param(1, {5, 7}), random_param(2, {7})};
    auto base = spec.make(std::vector<ParamGroup>{ParamGroup{a, spec.lr, spec.weight_decay}});
    GaLoreGroups groups;
    groups.plain.push_back(ParamGroup{b, spec.lr, spec.weight_decay});
    GaLore galore(spec, {.rank = 2}, std::move(groups));
    std::mt19937 gen(4);
    for (int s = 0; s < 4; ++s) {
      for (std::size_t i = 0; i < a.size(); ++i) {
        const Tensor g = random_tensor(gen, a[i].shape(), 1.0);
        a[i].set_grad(g);
        b[i].set_grad(g);
      }
      base->step();
      galore.step();
    }
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i], b[i])) << "param " << i;
    const StateDict sa = base->state_dict(), sb = galore.state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (const auto& [key, t] : sa) EXPECT_TRUE(sb.count(key) && bit_equal(sb.at(key), t)) << key;
    EXPECT_EQ(galore.state_bytes(), base->state_bytes());
  }
}

// ---- default parameter split and naming ------------------------------------------------------------------

TEST(GaLoreGroupsTest, DefaultTargetsAreAttentionAndMlpWeights) {
  auto t = [](const Shape& s) { return random_param(1, s); };
  const std::vector<std::pair<std::string, Tensor>> named{
      {"wte.weight", t({50, 8})},          {"wpe.weight", t({16, 8})},
      {"h.3.ln_1.weight", t({8})},         {"h.3.attn.c_attn.weight", t({24, 8})},
      {"h.3.attn.c_attn.bias", t({24})},   {"h.3.mlp.c_fc.weight", t({32, 8})},
      {"h.3.mlp.c_proj.weight", t({8, 32})}, {"ln_f.weight", t({8})},
      {"lm_head.weight", t({50, 8})},      {"embed_tokens.weight", t({50, 8})},
      {"layers.0.self_attn.q_proj.weight", t({8, 8})}, {"layers.0.mlp.gate_proj.weight", t({20, 8})},
      {"layers.0.input_layernorm.weight", t({8})}};
  const GaLoreGroups g = galore_groups(named, 1e-3, 0.1);
  ASSERT_EQ(g.projected.size(), 1u);
  const std::vector<std::string> want{"h.3.attn.c_attn.weight", "h.3.mlp.c_fc.weight", "h.3.mlp.c_proj.weight",
                                      "layers.0.self_attn.q_proj.weight", "layers.0.mlp.gate_proj.weight"};
  ASSERT_EQ(g.projected[0].params.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(is_galore_target(want[i], g.projected[0].params[i])) << want[i];
    for (const auto& [name, p] : named) {
      if (name == want[i]) {
        EXPECT_EQ(p.impl_ptr(), g.projected[0].params[i].impl_ptr()) << name;
      }
    }
  }
  EXPECT_DOUBLE_EQ(g.projected[0].weight_decay, 0.1);
  // The rest as decay_groups splits it: 2-D weights decay, vectors do not.
  ASSERT_EQ(g.plain.size(), 2u);
  EXPECT_EQ(g.plain[0].params.size(), 4u);  // wte, wpe, lm_head, embed_tokens
  EXPECT_DOUBLE_EQ(g.plain[0].weight_decay, 0.1);
  EXPECT_EQ(g.plain[1].params.size(), 4u);  // ln_1, c_attn.bias, ln_f, input_layernorm
  EXPECT_DOUBLE_EQ(g.plain[1].weight_decay, 0.0);
  EXPECT_FALSE(is_galore_target("h.3.attn.c_attn.bias", t({24, 8})));    // not a weight
  EXPECT_FALSE(is_galore_target("h.3.attention_norm.weight", t({8, 8})));  // "attn" must be a whole name

  GaLore opt(Spec::lion8bit(), {.rank = 4}, g);
  EXPECT_EQ(opt.name(), "galore-lion8bit");
  EXPECT_EQ(opt.param_groups().size(), 3u);
}

}  // namespace
}  // namespace memtrain::optim
