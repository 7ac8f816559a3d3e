// CPU GEMM throughput on transformer shapes: memtrain's oneDNN backend beside Eigen and OpenBLAS, fp32 and
// bf16, at 1 and 2 threads. Counters: GFLOP/s (2*M*N*K per call) and pct_of_peak, with
// peak = threads * per-core peak. The per-core peaks default to the project's reference CPU (Zen 5 with
// AVX-512: 217 fp32, 433 bf16 GFLOP/s) and are overridden by --peak_f32_per_core=X / --peak_bf16_per_core=X
// or MEMTRAIN_PEAK_F32 / MEMTRAIN_PEAK_BF16. BM_fma_peak measures what one core's FMA units actually reach,
// for setting those on another CPU.
//
// Shapes: the forward M x N x K of a GPT-2-small MLP/projection at 2048 tokens, a square 4096 GEMM, and
// for each 2048 forward (Y[M,N] = X[M,K] W[K,N]) the two backward products:
//   dX[M,K] = dY[M,N] W^T  -> NT, M x K x N        dW[K,N] = X^T dY[M,N] -> TN, K x N x M
// Run (medians over repetitions; when OpenBLAS is compared, unset the environment's OpenBLAS tuning):
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_gemm [--benchmark_filter=...]
// (defaults: --benchmark_repetitions=3 --benchmark_min_time=0.3, aggregates only.)
#include <benchmark/benchmark.h>
#include <omp.h>

#include <immintrin.h>

#include <Eigen/Core>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm.h"

#if defined(MEMTRAIN_BENCH_OPENBLAS)
#include <cblas.h>
#endif

namespace {

using memtrain::cpu::GemmBackend;

double g_peak_f32 = 217.0;   // GFLOP/s per core, fp32 FMA
double g_peak_bf16 = 433.0;  // GFLOP/s per core, bf16 dot product

struct Shape {
  const char* label;
  bool ta, tb;
  int64_t m, n, k;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  const int64_t fwd[][3] = {{2048, 768, 768}, {2048, 3072, 768}, {2048, 768, 3072}};
  for (const auto& s : fwd) out.push_back({"fwd", false, false, s[0], s[1], s[2]});
  out.push_back({"fwd", false, false, 4096, 4096, 4096});
  for (const auto& s : fwd) {
    out.push_back({"dX", false, true, s[0], s[2], s[1]});
    out.push_back({"dW", true, false, s[2], s[1], s[0]});
  }
  return out;
}

// Operands for one shape, stored tight (lda = stored row length), filled with small random values.
struct Operands {
  explicit Operands(const Shape& s, bool bf16) : s(s) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t na = static_cast<size_t>(s.m * s.k), nb = static_cast<size_t>(s.k * s.n);
    if (bf16) {
      a16.resize(na), b16.resize(nb);
      for (auto& x : a16) x = to_bf16(u(rng));
      for (auto& x : b16) x = to_bf16(u(rng));
    } else {
      a.resize(na), b.resize(nb);
      for (auto& x : a) x = u(rng);
      for (auto& x : b) x = u(rng);
    }
    c.assign(static_cast<size_t>(s.m * s.n), 0.0f);
  }
  static uint16_t to_bf16(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
  int64_t lda() const { return s.ta ? s.m : s.k; }
  int64_t ldb() const { return s.tb ? s.k : s.n; }
  Shape s;
  std::vector<float> a, b, c;
  std::vector<uint16_t> a16, b16;
};

void set_threads(int threads) {
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
#if defined(MEMTRAIN_BENCH_OPENBLAS)
  openblas_set_num_threads(threads);
#endif
}

void report(benchmark::State& state, const Shape& s, int threads, double peak_per_core) {
  const double gflop = 2.0 * double(s.m) * double(s.n) * double(s.k) * 1e-9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_of_peak"] =
      benchmark::Counter(gflop * 100.0 / (threads * peak_per_core), benchmark::Counter::kIsIterationInvariantRate);
}

void bm_memtrain_f32(benchmark::State& state, Shape s, GemmBackend backend, int threads) {
  set_threads(threads);
  memtrain::cpu::set_gemm_backend(backend);
  Operands op(s, false);
  for (auto _ : state) {
    memtrain::cpu::gemm_f32(s.ta, s.tb, s.m, s.n, s.k, 1.0f, op.a.data(), op.lda(), op.b.data(), op.ldb(), 0.0f,
                            op.c.data(), s.n);
    benchmark::DoNotOptimize(op.c.data());
  }
  report(state, s, threads, g_peak_f32);
}

void bm_memtrain_bf16(benchmark::State& state, Shape s, GemmBackend backend, int threads) {
  set_threads(threads);
  memtrain::cpu::set_gemm_backend(backend);
  Operands op(s, true);
  for (auto _ : state) {
    memtrain::cpu::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, op.a16.data(), op.lda(), op.b16.data(), op.ldb(),
                             0.0f, op.c.data(), s.n);
    benchmark::DoNotOptimize(op.c.data());
  }
  report(state, s, threads, g_peak_bf16);
}

// Eigen directly on the same buffers (what a plain Eigen user gets), not through memtrain.
void bm_eigen_f32(benchmark::State& state, Shape s, int threads) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  set_threads(threads);
  Operands op(s, false);
  Eigen::Map<const Mat> a(op.a.data(), s.ta ? s.k : s.m, s.ta ? s.m : s.k);
  Eigen::Map<const Mat> b(op.b.data(), s.tb ? s.n : s.k, s.tb ? s.k : s.n);
  Eigen::Map<Mat> c(op.c.data(), s.m, s.n);
  for (auto _ : state) {
    if (!s.ta && !s.tb) c.noalias() = a * b;
    if (!s.ta && s.tb) c.noalias() = a * b.transpose();
    if (s.ta && !s.tb) c.noalias() = a.transpose() * b;
    if (s.ta && s.tb) c.noalias() = a.transpose() * b.transpose();
    benchmark::DoNotOptimize(op.c.data());
  }
  report(state, s, threads, g_peak_f32);
}

#if defined(MEMTRAIN_BENCH_OPENBLAS)
void bm_openblas_f32(benchmark::State& state, Shape s, int threads) {
  set_threads(threads);
  Operands op(s, false);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(s.m),
                int(s.n), int(s.k), 1.0f, op.a.data(), int(op.lda()), op.b.data(), int(op.ldb()), 0.0f,
                op.c.data(), int(s.n));
    benchmark::DoNotOptimize(op.c.data());
  }
  report(state, s, threads, g_peak_f32);
}
#endif

// One core's FMA throughput with the widest vectors this build targets: 12 independent accumulator chains
// (enough to cover FMA latency x ports on current x86 cores), so the loop is bound by the FMA units alone.
// Intrinsics, because ISO C++ mode (-std=c++20) keeps GCC from contracting a*b+c into an FMA.
#if defined(__AVX512F__)
using FmaVec = __m512;
constexpr int kFmaLanes = 16;
inline FmaVec fma_set1(float v) { return _mm512_set1_ps(v); }
inline FmaVec fma_step(FmaVec a, FmaVec x, FmaVec y) { return _mm512_fmadd_ps(a, x, y); }
#else
using FmaVec = __m256;
constexpr int kFmaLanes = 8;
inline FmaVec fma_set1(float v) { return _mm256_set1_ps(v); }
inline FmaVec fma_step(FmaVec a, FmaVec x, FmaVec y) { return _mm256_fmadd_ps(a, x, y); }
#endif

void bm_fma_peak(benchmark::State& state) {
  constexpr int kChains = 12;
  set_threads(1);
  FmaVec acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = fma_set1(0.001f * float(i));
  const FmaVec x = fma_set1(0.9999f), y = fma_set1(1e-6f);
  constexpr int64_t kInner = 1 << 20;
  for (auto _ : state) {
    for (int64_t it = 0; it < kInner; ++it) {
#pragma GCC unroll 12
      for (int i = 0; i < kChains; ++i) acc[i] = fma_step(acc[i], x, y);
    }
    benchmark::DoNotOptimize(acc);
  }
  const double gflop = 2.0 * kChains * kFmaLanes * double(kInner) * 1e-9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_of_peak"] =
      benchmark::Counter(gflop * 100.0 / g_peak_f32, benchmark::Counter::kIsIterationInvariantRate);
}

std::string name(const char* dtype, const char* impl, const Shape& s, int threads) {
  return std::string("gemm/") + dtype + "/" + impl + "/" + s.label + (s.ta ? "_T" : "_N") + (s.tb ? "T" : "N") +
         "/" + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
         "/threads:" + std::to_string(threads);
}

void tune(benchmark::internal::Benchmark* b) {
  // Wall time, since the work runs on other threads; medians of repetitions tame a shared machine.
  // Repetitions and min time come from the command line (defaults added in main), so they stay tunable.
  b->UseRealTime()->Unit(benchmark::kMillisecond)->ReportAggregatesOnly(true);
}

void register_all() {
  tune(benchmark::RegisterBenchmark("fma_peak/f32/threads:1", bm_fma_peak));
  const bool have_onednn = memtrain::cpu::gemm_onednn_available();
  for (const Shape& s : shapes()) {
    for (int threads : {1, 2}) {
      if (have_onednn) {
        tune(benchmark::RegisterBenchmark(name("f32", "onednn", s, threads).c_str(), bm_memtrain_f32, s,
                                          GemmBackend::onednn, threads));
      }
      tune(benchmark::RegisterBenchmark(name("f32", "eigen", s, threads).c_str(), bm_eigen_f32, s, threads));
#if defined(MEMTRAIN_BENCH_OPENBLAS)
      tune(benchmark::RegisterBenchmark(name("f32", "openblas", s, threads).c_str(), bm_openblas_f32, s, threads));
#endif
      // bf16: memtrain's path on each backend (native bf16 matmul where the CPU has it, else widened to f32
      // in blocks). Eigen has no fast bf16 GEMM and Debian's OpenBLAS is built without sbgemm.
      if (have_onednn) {
        tune(benchmark::RegisterBenchmark(name("bf16", "onednn", s, threads).c_str(), bm_memtrain_bf16, s,
                                          GemmBackend::onednn, threads));
      }
      tune(benchmark::RegisterBenchmark(name("bf16", "eigen", s, threads).c_str(), bm_memtrain_bf16, s,
                                        GemmBackend::eigen, threads));
    }
  }
}

// Takes --name=value out of argv (so Google Benchmark does not reject it); true when found.
bool take_flag(int* argc, char** argv, const char* flag, double* value) {
  const std::string prefix = std::string("--") + flag + "=";
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      *value = std::atof(argv[i] + prefix.size());
      for (int j = i; j + 1 < *argc; ++j) argv[j] = argv[j + 1];
      --*argc;
      return true;
    }
  }
  return false;
}

bool has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag, std::strlen(flag)) == 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* env = std::getenv("MEMTRAIN_PEAK_F32")) g_peak_f32 = std::atof(env);
  if (const char* env = std::getenv("MEMTRAIN_PEAK_BF16")) g_peak_bf16 = std::atof(env);
  take_flag(&argc, argv, "peak_f32_per_core", &g_peak_f32);
  take_flag(&argc, argv, "peak_bf16_per_core", &g_peak_bf16);
  benchmark::AddCustomContext("peak_f32_per_core_gflops", std::to_string(g_peak_f32));
  benchmark::AddCustomContext("peak_bf16_per_core_gflops", std::to_string(g_peak_bf16));
#if defined(MEMTRAIN_BENCH_OPENBLAS)
  benchmark::AddCustomContext("openblas_config", openblas_get_config());
#endif
  register_all();
  // Defaults for a short, repeatable run, unless given: 3 repetitions (medians reported) of >= 0.3 s each.
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=3", min_time = "--benchmark_min_time=0.3";
  if (!has_flag(argc, argv, "--benchmark_repetitions")) args.push_back(reps.data());
  if (!has_flag(argc, argv, "--benchmark_min_time")) args.push_back(min_time.data());
  argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  argv = args.data();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
