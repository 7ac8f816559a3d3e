// GaLore projector refresh: exact (BDCSVD) vs randomized range finder (cold, q = 2 power iterations; warm
// start from the previous basis, q = 1) at the paper's shapes and ranks. Each timed iteration is one
// refresh, i.e. project(G, step) on a step that is due (the SVD plus the r x n projection).
// Test matrix: G = X diag(d) Y + 1e-3 * noise with Gaussian X (m x k), Y (k x n), k = min(m, n, 1024) and a
// power-law spectrum d_i = 1 / (1 + i), so the top-r subspace is well defined but not trivially separated.
// Warm start refreshes on G' = G + 0.05 * ||G||-scaled noise after a first refresh on G (a gradient that
// moved between refreshes). Counters: subspace_err = ||P P^T - Pe Pe^T||_F / sqrt(2 r) against the exact
// basis Pe of the same matrix (0 = same subspace, 1 = orthogonal), energy = ||P^T G||_F^2 / ||Pe^T G||_F^2.
// BM_GaLoreSignRule times the canonical sign rule that every refresh above includes, on its own.
// Run: bench_galore_svd --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// MEMTRAIN_BENCH_GALORE_LARGE=1 adds 4096 x 4096 at ranks 128 and 256 (the exact SVD takes about 50 s each there on 2 cores).
#include "memtrain/core/tensor.h"
#include "memtrain/optim/galore_projector.h"

#include <Eigen/Core>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <tuple>

namespace {

using namespace memtrain;
using namespace memtrain::optim;
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMap = Eigen::Map<const RowMatF>;

enum Kind { kExact, kRandomized, kWarm };

RowMatF gaussian(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd;
  RowMatF m(rows, cols);
  for (std::int64_t i = 0; i < m.size(); ++i) m.data()[i] = nd(gen);
  return m;
}

Tensor to_tensor(const RowMatF& m) {
  Tensor t = Tensor::empty({m.rows(), m.cols()}, DType::f32);
  Eigen::Map<RowMatF>(t.data<float>(), m.rows(), m.cols()) = m;
  return t;
}

struct Case {
  Tensor g;        // the matrix refreshed on
  Tensor g_prev;   // the earlier gradient a warm start refreshed on first
  Tensor p_exact;  // exact basis of g
};

GaLoreProjectorOptions options(std::int64_t r, GaLoreSvd svd) {
  GaLoreProjectorOptions o;
  o.rank = r;
  o.svd = svd;
  o.proj_type = GaLoreProjType::std_side;
  return o;
}

const Case& get_case(std::int64_t m, std::int64_t n, std::int64_t r) {
  static std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, Case> cache;
  auto it = cache.find({m, n, r});
  if (it != cache.end()) return it->second;
  const std::int64_t k = std::min<std::int64_t>({m, n, 1024});
  Eigen::VectorXf d(k);
  for (std::int64_t i = 0; i < k; ++i) d[i] = 1.0f / static_cast<float>(1 + i);
  RowMatF g = gaussian(m, k, 1) * d.asDiagonal() * gaussian(k, n, 2);
  g += 1e-3f * gaussian(m, n, 3);
  const float scale = g.norm() / std::sqrt(static_cast<float>(m * n));
  Case c;
  c.g_prev = to_tensor(g);
  g += 0.05f * scale * gaussian(m, n, 4);
  c.g = to_tensor(g);
  GaLoreProjector exact(options(r, GaLoreSvd::exact));
  exact.project(c.g, 0);
  c.p_exact = exact.matrix().clone();
  return cache.emplace(std::make_tuple(m, n, r), std::move(c)).first->second;
}

void BM_GaLoreRefresh(benchmark::State& state, Kind kind) {
  const std::int64_t m = state.range(0), n = state.range(1), r = state.range(2);
  const Case& c = get_case(m, n, r);
  GaLoreProjectorOptions o = options(r, kind == kExact ? GaLoreSvd::exact : GaLoreSvd::randomized);
  if (kind == kWarm) o.power_iterations = 1;
  Tensor p;
  for (auto _ : state) {
    GaLoreProjector proj(o);
    if (kind == kWarm) proj.project(c.g_prev, 0);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor out = proj.project(c.g, o.update_gap);
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(out.data_ptr());
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    p = proj.matrix().clone();
  }
  const ConstRowMap pe(c.p_exact.data<float>(), c.p_exact.size(0), r), pr(p.data<float>(), p.size(0), r);
  const double overlap = (pe.transpose().cast<double>() * pr.cast<double>()).squaredNorm();
  state.counters["subspace_err"] = std::sqrt(std::max(0.0, 2.0 * r - 2.0 * overlap) / (2.0 * r));
  const ConstRowMap g(c.g.data<float>(), m, n);
  const bool left = p.size(0) == m;
  const auto energy = [&](const ConstRowMap& b) {
    return left ? (b.transpose().cast<double>() * g.cast<double>()).squaredNorm()
                : (g.cast<double>() * b.cast<double>()).squaredNorm();
  };
  state.counters["energy"] = energy(pr) / energy(pe);
}

// The canonical sign rule alone (galore_projector.h), on the exact basis of the same shapes, aligned to a
// previous basis (the refresh case: r dot products of length rows): its share of a refresh's time.
void BM_GaLoreSignRule(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), r = state.range(2);
  const Case& c = get_case(m, n, r);
  const Tensor previous = c.p_exact.clone();
  for (auto _ : state) {
    Tensor basis = c.p_exact.clone();
    const auto t0 = std::chrono::steady_clock::now();
    apply_canonical_signs(basis, previous);
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({768, 768, 128})->Args({768, 3072, 128})->Args({3072, 768, 128});
  if (const char* e = std::getenv("MEMTRAIN_BENCH_GALORE_LARGE"); e && std::string(e) == "1") {
    b->Args({4096, 4096, 128})->Args({4096, 4096, 256});
  } else {
    b->Args({2048, 2048, 256});
  }
  b->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
}

BENCHMARK_CAPTURE(BM_GaLoreRefresh, exact, kExact)->Apply(shapes);
BENCHMARK_CAPTURE(BM_GaLoreRefresh, randomized_q2, kRandomized)->Apply(shapes);
BENCHMARK_CAPTURE(BM_GaLoreRefresh, randomized_warm_q1, kWarm)->Apply(shapes);
BENCHMARK(BM_GaLoreSignRule)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
