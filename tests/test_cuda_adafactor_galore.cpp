// Adafactor and GaLore with parameters on a CUDA device, against the CPU classes as the reference.
// - Adafactor: cuda::adafactor_*_step through optim::Adafactor, on a matrix, a tall matrix (several column
//   chunks), a batched rank-3 tensor and a vector, with and without the first moment and with update clipping
//   active, 20 steps, parameters after every step and the state at the end: normwise relative 1e-5 (the CPU
//   compiler may contract f32 products into FMAs the device does not do: an ulp per step). The device run is
//   also repeated and must give the same bits (the reductions are deterministic).
// - GaLoreProjector on the device: orthonormal columns, the span of the top-r singular vectors of a gradient
//   with a known, well-separated spectrum (residual against the float64 truncated SVD), each column equal to
//   the CPU basis's (the canonical signs, galore_projector.h, fix what the two SVD libraries leave free), the
//   same Philox position as the CPU, projections equal to float64 products of the downloaded basis, for left /
//   right / full sides, exact and randomized SVD, cold and warm refreshes.
// - GaLore with a CUDA parameter tracking the same optimizer on the CPU over three refreshes, with beta1 = 0
//   and with the first moment (which a basis sign flipped by one library but not the other would have mixed
//   with the wrong sign after a refresh: the canonical signs make the two bases the same).
// - state_dict round trip on the device: a restored device optimizer continues as the uninterrupted one.
// Skipped without a device.
#include "memtrain/core/error.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/optim/adafactor.h"
#include "memtrain/optim/galore.h"
#include "memtrain/optim/galore_projector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace memtrain {
namespace {

using optim::ParamGroup;

std::vector<double> host_values(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  std::vector<double> out(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = c.data<float>()[i];
  return out;
}

Tensor tensor_of(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = static_cast<float>(v[i]);
  return t;
}

// ||a - b|| / ||b|| (b: the reference); infinite when a holds NaN or Inf.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d2 = 0.0, r2 = 0.0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    d2 += (a[i] - b[i]) * (a[i] - b[i]);
    r2 += b[i] * b[i];
  }
  return r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
}

double rel_diff(const Tensor& device_side, const Tensor& cpu_side) {
  return rel_diff(host_values(device_side), host_values(cpu_side));
}

Tensor randn_tensor(std::mt19937& gen, const Shape& shape) {
  std::normal_distribution<double> dist;
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return tensor_of(v, shape);
}

// ---- Adafactor ----------------------------------------------------------------------------------------------

void expect_adafactor_device_matches_cpu(const optim::AdafactorOptions& options, double weight_decay) {
  const std::vector<Shape> shapes{{48, 70}, {600, 9}, {3, 20, 33}, {300}};
  std::mt19937 gen(11);
  std::vector<Tensor> cpu_params, dev_params, dev2_params;
  for (const Shape& s : shapes) {
    cpu_params.push_back(randn_tensor(gen, s));
    dev_params.push_back(cpu_params.back().to(Device::cuda(0)));
    dev2_params.push_back(cpu_params.back().to(Device::cuda(0)));
  }
  auto groups = [&](const std::vector<Tensor>& p) {
    return std::vector<ParamGroup>{ParamGroup{{p[0], p[1], p[2]}, 1e-2, weight_decay, 0.9},
                                   ParamGroup{{p[3]}, 3e-3, 0.0, 0.8}};
  };
  optim::Adafactor cpu_opt(groups(cpu_params), options), dev_opt(groups(dev_params), options),
      dev2_opt(groups(dev2_params), options);
  for (int step = 0; step < 20; ++step) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      // Rows of very different scale, so the factored statistics matter.
      Tensor g = randn_tensor(gen, shapes[i]);
      if (shapes[i].size() >= 2)
        for (std::int64_t k = 0; k < g.numel(); ++k) g.data<float>()[k] *= 1.0f + static_cast<float>(k / shapes[i].back() % 5);
      cpu_params[i].set_grad(g);
      dev_params[i].set_grad(g.to(Device::cuda(0)));
      dev2_params[i].set_grad(g.to(Device::cuda(0)));
    }
    ASSERT_EQ(cpu_opt.step().updated, 4);
    ASSERT_EQ(dev_opt.step().updated, 4);
    ASSERT_EQ(dev2_opt.step().updated, 4);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_LT(rel_diff(dev_params[i], cpu_params[i]), 1e-5) << "param " << i << " step " << step;
      EXPECT_EQ(host_values(dev_params[i]), host_values(dev2_params[i]))
          << "device run not deterministic: param " << i << " step " << step;
    }
  }
  const optim::StateDict cpu_state = cpu_opt.state_dict(), dev_state = dev_opt.state_dict();
  ASSERT_EQ(cpu_state.size(), dev_state.size());
  for (const auto& [key, t] : cpu_state) {
    ASSERT_TRUE(dev_state.count(key)) << key;
    const Tensor& d = dev_state.at(key);
    EXPECT_TRUE(d.device().is_cpu()) << key;
    ASSERT_EQ(d.shape(), t.shape()) << key;
    if (t.dtype() == DType::f32) {
      EXPECT_LT(rel_diff(d, t), 1e-5) << key;
    } else {
      EXPECT_EQ(d.item(), t.item()) << key;
    }
  }
}

TEST(CudaAdafactor, MatchesCpuWithoutFirstMoment) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_adafactor_device_matches_cpu({}, 0.1);
}

TEST(CudaAdafactor, MatchesCpuWithFirstMomentAndClipping) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  optim::AdafactorOptions o;
  o.use_first_moment = true;
  o.clip_threshold = 0.5;  // RMS(u) is ~1 from the first step: clipping is active
  expect_adafactor_device_matches_cpu(o, 0.05);
}

TEST(CudaAdafactor, FactoredStateHasRowAndColumnShapes) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Tensor p = randn({6, 5}).to(Device::cuda(0));
  p.set_grad(randn({6, 5}).to(Device::cuda(0)));
  optim::Adafactor opt({ParamGroup{{p}, 1e-2}});
  opt.step();
  const optim::StateDict s = opt.state_dict();
  ASSERT_TRUE(s.count("0.exp_avg_sq_row"));
  EXPECT_EQ(s.at("0.exp_avg_sq_row").shape(), Shape({6}));
  EXPECT_EQ(s.at("0.exp_avg_sq_col").shape(), Shape({5}));
  EXPECT_EQ(opt.state_bytes(), (6 + 5) * sizeof(float));
}

// ---- GaLore projector ---------------------------------------------------------------------------------------

// rows x cols (rows >= cols), orthonormal columns: modified Gram-Schmidt of Gaussian columns, in double.
std::vector<double> orthonormal(std::int64_t rows, std::int64_t cols, std::mt19937& gen) {
  std::normal_distribution<double> dist;
  std::vector<double> q(static_cast<std::size_t>(rows * cols));
  for (auto& x : q) x = dist(gen);
  auto at = [&](std::int64_t i, std::int64_t j) -> double& { return q[static_cast<std::size_t>(i * cols + j)]; };
  for (std::int64_t j = 0; j < cols; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (std::int64_t k = 0; k < j; ++k) {
        double dot = 0.0;
        for (std::int64_t i = 0; i < rows; ++i) dot += at(i, k) * at(i, j);
        for (std::int64_t i = 0; i < rows; ++i) at(i, j) -= dot * at(i, k);
      }
    }
    double norm = 0.0;
    for (std::int64_t i = 0; i < rows; ++i) norm += at(i, j) * at(i, j);
    norm = std::sqrt(norm);
    for (std::int64_t i = 0; i < rows; ++i) at(i, j) /= norm;
  }
  return q;
}

// G = X diag(s) Y^T with s_i = 10 * 0.6^i (a gap of 40% between neighbours), and its truncation G_r.
struct Spectral {
  std::int64_t m = 0, n = 0;
  std::vector<double> g, g_r;
};

Spectral spectral(std::int64_t m, std::int64_t n, std::int64_t r, std::mt19937& gen) {
  const std::int64_t k = std::min(m, n);
  const std::vector<double> X = orthonormal(m, k, gen), Y = orthonormal(n, k, gen);
  Spectral out{m, n, std::vector<double>(static_cast<std::size_t>(m * n)), std::vector<double>(static_cast<std::size_t>(m * n))};
  for (std::int64_t l = 0; l < k; ++l) {
    const double s = 10.0 * std::pow(0.6, static_cast<double>(l));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const double v = s * X[static_cast<std::size_t>(i * k + l)] * Y[static_cast<std::size_t>(j * k + l)];
        out.g[static_cast<std::size_t>(i * n + j)] += v;
        if (l < r) out.g_r[static_cast<std::size_t>(i * n + j)] += v;
      }
  }
  return out;
}

// Row-major double matrix products for the checks.
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, std::int64_t m, std::int64_t k,
                           std::int64_t n, bool trans_a = false, bool trans_b = false) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t l = 0; l < k; ++l) {
      const double x = trans_a ? a[static_cast<std::size_t>(l * m + i)] : a[static_cast<std::size_t>(i * k + l)];
      for (std::int64_t j = 0; j < n; ++j)
        c[static_cast<std::size_t>(i * n + j)] +=
            x * (trans_b ? b[static_cast<std::size_t>(j * k + l)] : b[static_cast<std::size_t>(l * n + j)]);
    }
  return c;
}

// B B^T for a row-major (rows, r) basis B: the orthogonal projector onto its span (sign- and rotation-free).
std::vector<double> span_projector(const std::vector<double>& b, std::int64_t rows, std::int64_t r) {
  return matmul(b, b, rows, r, rows, false, true);
}

void expect_orthonormal(const std::vector<double>& b, std::int64_t rows, std::int64_t r, const std::string& what) {
  const std::vector<double> btb = matmul(b, b, r, rows, r, true, false);
  double worst = 0.0;
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < r; ++j)
      worst = std::max(worst, std::abs(btb[static_cast<std::size_t>(i * r + j)] - (i == j ? 1.0 : 0.0)));
  EXPECT_LT(worst, 1e-4) << what << ": B^T B - I";  // f32 QR / SVD: ~1e-6; a wrong basis: O(1)
}

// Each device column equals the CPU column, sign included (canonical signs): <d_i, c_i> = 1 for unit vectors.
void expect_same_columns(const std::vector<double>& d, const std::vector<double>& c, std::int64_t rows,
                         std::int64_t r, const std::string& what) {
  for (std::int64_t j = 0; j < r; ++j) {
    double dot = 0.0;
    for (std::int64_t i = 0; i < rows; ++i)
      dot += d[static_cast<std::size_t>(i * r + j)] * c[static_cast<std::size_t>(i * r + j)];
    EXPECT_GT(dot, 1.0 - 1e-5) << what << ": column " << j;
  }
}

void check_projector_on_device(optim::GaLoreProjType type, optim::GaLoreSvd svd, std::int64_t m, std::int64_t n) {
  const std::string what = std::string(optim::galore_proj_type_name(type)) + " " + optim::galore_svd_name(svd) + " " +
                           std::to_string(m) + "x" + std::to_string(n);
  SCOPED_TRACE(what);
  constexpr std::int64_t r = 5;
  optim::GaLoreProjectorOptions o;
  o.rank = r;
  o.update_gap = 2;
  o.scale = 0.5;
  o.proj_type = type;
  o.svd = svd;
  optim::GaLoreProjector dev(o), cpu(o);
  std::mt19937 gen(5);
  for (const std::int64_t step : {0, 1, 2}) {  // refresh (cold), no refresh, refresh (warm start)
    const Spectral s = spectral(m, n, r, gen);
    const Tensor G = tensor_of(s.g, {m, n});
    const Tensor R_dev = dev.project(G.to(Device::cuda(0)), step);
    const Tensor R_cpu = cpu.project(G, step);
    ASSERT_EQ(dev.refreshed_last(), cpu.refreshed_last());
    EXPECT_EQ(dev.device(), Device::cuda(0));
    EXPECT_TRUE(R_dev.device().is_cuda());
    EXPECT_EQ(dev.rng_state().seed, cpu.rng_state().seed);
    EXPECT_EQ(dev.rng_state().offset, cpu.rng_state().offset) << "the device draws the CPU's Gaussians";
    EXPECT_EQ(dev.bytes(), cpu.bytes());
    // The basis: orthonormal, the same columns as the CPU's (signs included), spans the top-r singular subspace.
    const bool has_left = dev.left_matrix().defined(), has_right = dev.right_matrix().defined();
    ASSERT_EQ(has_left, cpu.left_matrix().defined());
    ASSERT_EQ(has_right, cpu.right_matrix().defined());
    std::vector<double> approx = s.g;  // P P^T G, G Q Q^T or P P^T G Q Q^T
    std::vector<double> P, Q;
    if (has_left) {
      P = host_values(dev.left_matrix());
      expect_orthonormal(P, m, r, "left");
      expect_same_columns(P, host_values(cpu.left_matrix()), m, r, "left");
      approx = matmul(span_projector(P, m, r), approx, m, m, n);
    }
    if (has_right) {
      Q = host_values(dev.right_matrix());
      expect_orthonormal(Q, n, r, "right");
      expect_same_columns(Q, host_values(cpu.right_matrix()), n, r, "right");
      approx = matmul(approx, span_projector(Q, n, r), m, n, n);
    }
    // ||approx - G_r|| / ||G_r||: the top-r subspace of the float64 truncated SVD (f32 input and basis).
    EXPECT_LT(rel_diff(approx, s.g_r), 1e-4) << "step " << step;
    // The projection and the back-projection against float64 products of the downloaded basis.
    std::vector<double> R_ref = s.g;
    std::int64_t rows = m, cols = n;
    if (has_left) {
      R_ref = matmul(P, R_ref, r, m, cols, /*trans_a=*/true);
      rows = r;
    }
    if (has_right) {
      R_ref = matmul(R_ref, Q, rows, n, r);
      cols = r;
    }
    EXPECT_LT(rel_diff(host_values(R_dev), R_ref), 1e-5) << "R, step " << step;
    const Tensor N = randn_tensor(gen, {rows, cols});
    std::vector<double> back = host_values(N);
    if (has_left) back = matmul(P, back, m, r, cols);
    if (has_right) back = matmul(back, Q, m, r, n, false, /*trans_b=*/true);
    for (double& x : back) x *= o.scale;
    EXPECT_LT(rel_diff(host_values(dev.project_back(N.to(Device::cuda(0)))), back), 1e-5) << "back, step " << step;
    // project_add accumulates on the device: acc = R + R.
    Tensor acc = R_dev.to(Device::cuda(0));
    dev.project_add(G.to(Device::cuda(0)), acc);
    std::vector<double> twice = host_values(R_dev);
    for (double& x : twice) x *= 2.0;
    EXPECT_LT(rel_diff(host_values(acc), twice), 1e-6) << "project_add, step " << step;
  }
  // Mixing devices is refused, naming both.
  const Tensor G_cpu = tensor_of(spectral(m, n, r, gen).g, {m, n});
  try {
    dev.project(G_cpu, 3);
    FAIL() << "a CPU gradient was accepted by a device projector";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

TEST(CudaGaLoreProjector, DeviceBasisSpansTheTopSingularSubspace) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const optim::GaLoreSvd svd : {optim::GaLoreSvd::randomized, optim::GaLoreSvd::exact}) {
    check_projector_on_device(optim::GaLoreProjType::std_side, svd, 24, 40);  // left
    check_projector_on_device(optim::GaLoreProjType::std_side, svd, 40, 24);  // right
    check_projector_on_device(optim::GaLoreProjType::full, svd, 24, 40);
    check_projector_on_device(optim::GaLoreProjType::full, svd, 40, 24);
  }
}

// ---- GaLore optimizer ---------------------------------------------------------------------------------------

struct GaLoreRun {
  optim::Spec spec;
  optim::GaLoreSpec galore;
};

optim::GaLoreGroups projected_only(const Tensor& w, double lr, double wd) {
  optim::GaLoreGroups g;
  g.projected.push_back(ParamGroup{{w}, lr, wd});
  return g;
}

// W - W0 on the host.
std::vector<double> change(const Tensor& w, const std::vector<double>& w0) {
  std::vector<double> d = host_values(w);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] -= w0[i];
  return d;
}

// Steps a CPU and a device GaLore with the same gradients (well-separated spectra, fresh each step) and
// compares the parameters' total change after every step while `step < compare_until`. Returns both optimizers'
// projectors' bases at the end for further checks.
void track_cpu(const GaLoreRun& run, std::int64_t m, std::int64_t n, int steps, int compare_until, double tol,
               std::unique_ptr<optim::GaLore>* dev_out = nullptr, std::unique_ptr<optim::GaLore>* cpu_out = nullptr) {
  std::mt19937 gen(3);
  Tensor w_cpu = randn_tensor(gen, {m, n});
  Tensor w_dev = w_cpu.to(Device::cuda(0));
  const std::vector<double> w0 = host_values(w_cpu);
  auto cpu = std::make_unique<optim::GaLore>(run.spec, run.galore, projected_only(w_cpu, run.spec.lr, 0.1));
  auto dev = std::make_unique<optim::GaLore>(run.spec, run.galore, projected_only(w_dev, run.spec.lr, 0.1));
  for (int step = 0; step < steps; ++step) {
    const Tensor g = tensor_of(spectral(m, n, 1, gen).g, {m, n});
    w_cpu.set_grad(g);
    w_dev.set_grad(g.to(Device::cuda(0)));
    ASSERT_EQ(cpu->step().updated, 1);
    ASSERT_EQ(dev->step().updated, 1);
    EXPECT_TRUE(w_dev.device().is_cuda());
    if (step < compare_until) {
      // The change rather than W itself: a wrong update is then a large relative error, not 1e-3 of ||W||.
      EXPECT_LT(rel_diff(change(w_dev, w0), change(w_cpu, w0)), tol) << cpu->name() << " step " << step;
    }
  }
  if (dev_out) *dev_out = std::move(dev);
  if (cpu_out) *cpu_out = std::move(cpu);
}

// Tolerance 1e-4 on the accumulated change: the two bases differ by f32 rounding amplified by 1/gap (~1e-6),
// and Adam's m / sqrt(v) turns a relative error of R into the same relative error of the update.
TEST(CudaGaLore, AdamWWithoutMomentumTracksCpuAcrossRefreshes) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const auto type : {optim::GaLoreProjType::std_side, optim::GaLoreProjType::full}) {
    using Size = std::pair<std::int64_t, std::int64_t>;
    for (const auto& [m, n] : {Size{24, 40}, Size{40, 24}}) {
      SCOPED_TRACE(std::string(optim::galore_proj_type_name(type)) + " " + std::to_string(m) + "x" + std::to_string(n));
      const GaLoreRun run{optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.0}),
                          {.rank = 4, .update_gap = 3, .scale = 0.25, .proj_type = type}};
      track_cpu(run, m, n, 8, 8, 1e-4);  // refreshes at steps 0, 3, 6
    }
  }
}

TEST(CudaGaLore, AdamW8bitWithoutMomentumTracksCpuAcrossRefreshes) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  // R is 4 x 48 = 192 elements: 8-bit state in three blocks of 64. The 8-bit update uses the fresh f32
  // moments, so with beta1 = 0 the signed first moment's codes never feed back: still sign-invariant.
  const GaLoreRun run{optim::Spec::adamw8bit({.lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.0, .block_size = 64,
                                              .min_8bit_size = 64}),
                      {.rank = 4, .update_gap = 3, .scale = 0.25}};
  std::unique_ptr<optim::GaLore> dev, cpu;
  track_cpu(run, 32, 48, 7, 7, 1e-4, &dev, &cpu);
  // The device state is 8-bit and on the device: the same bytes as the CPU's.
  EXPECT_EQ(dev->state_bytes(), cpu->state_bytes());
}

// The first moment carries over each refresh in the basis's coordinates: the CPU and the device agree through
// three refreshes only because both bases take the canonical signs.
TEST(CudaGaLore, AdamWWithMomentumTracksCpuAcrossRefreshes) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const GaLoreRun run{optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}),
                      {.rank = 4, .update_gap = 3, .scale = 0.25}};
  std::unique_ptr<optim::GaLore> dev, cpu;
  track_cpu(run, 32, 48, 8, 8, 1e-4, &dev, &cpu);  // refreshes at steps 0, 3, 6
  const Tensor& w_dev = dev->param_groups()[0].params[0];
  const Tensor& w_cpu = cpu->param_groups()[0].params[0];
  EXPECT_EQ(dev->projector(w_dev)->refresh_count(), 3);
  EXPECT_LT(rel_diff(host_values(dev->projector(w_dev)->left_matrix()),
                     host_values(cpu->projector(w_cpu)->left_matrix())), 1e-4);
}

TEST(CudaGaLore, StateDictRoundTripOnDevice) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const optim::Spec& spec : {optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1}),
                                  optim::Spec::adamw8bit({.lr = 1e-2, .block_size = 64, .min_8bit_size = 64})}) {
    SCOPED_TRACE(spec.to_string());
    const optim::GaLoreSpec gs{.rank = 4, .update_gap = 3, .scale = 0.25};
    std::mt19937 gen(9);
    Tensor w = randn_tensor(gen, {32, 48}).to(Device::cuda(0));
    optim::GaLore opt(spec, gs, projected_only(w, spec.lr, 0.1));
    std::vector<Tensor> grads;
    for (int i = 0; i < 8; ++i) grads.push_back(tensor_of(spectral(32, 48, 1, gen).g, {32, 48}).to(Device::cuda(0)));
    for (int i = 0; i < 4; ++i) {
      w.set_grad(grads[static_cast<std::size_t>(i)]);
      opt.step();
    }
    const optim::StateDict saved = opt.state_dict();
    for (const auto& [key, t] : saved) EXPECT_TRUE(t.device().is_cpu()) << key;
    ASSERT_TRUE(saved.count("0.galore.left"));
    Tensor w2 = w.to(Device::cpu()).to(Device::cuda(0));
    optim::GaLore resumed(spec, gs, projected_only(w2, spec.lr, 0.1));
    resumed.load_state_dict(saved);
    EXPECT_EQ(resumed.state_bytes(), opt.state_bytes());
    EXPECT_TRUE(resumed.projector(w2)->left_matrix().device().is_cuda());
    const std::vector<double> w_at_save = host_values(w);
    for (int i = 4; i < 8; ++i) {  // crosses the refresh at step 6 (warm start from the restored basis)
      w.set_grad(grads[static_cast<std::size_t>(i)]);
      w2.set_grad(grads[static_cast<std::size_t>(i)]);
      opt.step();
      resumed.step();
      // Same inputs, same kernels, same device: equal up to cuBLAS/cuSOLVER run-to-run rounding (in practice 0).
      EXPECT_LT(rel_diff(change(w2, w_at_save), change(w, w_at_save)), 1e-6) << "step " << i;
    }
  }
}

TEST(CudaGaLore, LayerwiseAccumulationOnDeviceTracksCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const optim::Spec spec = optim::Spec::adamw({.lr = 1e-2, .beta1 = 0.0});  // sign-invariant (see the top)
  const optim::GaLoreSpec gs{.rank = 4, .update_gap = 2, .scale = 0.25};
  std::mt19937 gen(21);
  Tensor w_cpu = randn_tensor(gen, {32, 48});
  Tensor w_dev = w_cpu.to(Device::cuda(0));
  const std::vector<double> w0 = host_values(w_cpu);
  optim::GaLore cpu(spec, gs, projected_only(w_cpu, spec.lr, 0.0)), dev(spec, gs, projected_only(w_dev, spec.lr, 0.0));
  for (int step = 0; step < 4; ++step) {
    const Tensor g1 = tensor_of(spectral(32, 48, 1, gen).g, {32, 48});
    const Tensor g2 = tensor_of(spectral(32, 48, 1, gen).g, {32, 48});
    cpu.accumulate(w_cpu, g1);
    dev.accumulate(w_dev, g1.to(Device::cuda(0)));
    EXPECT_TRUE(dev.has_accumulated(w_dev));
    const Tensor R_cpu = cpu.projected_gradient(w_cpu, g2);
    const Tensor R_dev = dev.projected_gradient(w_dev, g2.to(Device::cuda(0)));
    ASSERT_TRUE(R_dev.defined());
    EXPECT_TRUE(R_dev.device().is_cuda());
    ASSERT_TRUE(cpu.step_projected_gradient(w_cpu, R_cpu));
    ASSERT_TRUE(dev.step_projected_gradient(w_dev, R_dev));
    EXPECT_LT(rel_diff(change(w_dev, w0), change(w_cpu, w0)), 1e-4) << "step " << step;
  }
  // R on the wrong device is refused, naming the devices.
  try {
    dev.step_projected_gradient(w_dev, Tensor::empty({4, 48}, DType::f32));
    FAIL() << "a CPU R was accepted for a cuda:0 parameter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("on cuda:0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memtrain
