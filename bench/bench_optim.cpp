// Optimizer step throughput: AdamW, AdamW8bit, Lion, Lion8bit over one flat parameter of 16M and 64M
// elements (100M too with MEMTRAIN_BENCH_OPTIM_LARGE=1), on 1 and 2 OpenMP threads. Counters: parameters/s
// and bytes of optimizer state per parameter. At the end it prints each step time over the fp32 AdamW step
// time at the same size and thread count (target for the 8-bit ones <= 1.5), from the medians when run with
// --benchmark_repetitions: wall time, and CPU time of the timing thread, which on 1 thread is all the work
// and is the steadier figure on a shared machine.
// Round-robin mode (MEMTRAIN_BENCH_OPTIM_ROUNDS=R): per size and thread count the four optimizers live side
// by side and step in turn, R rounds, each keeping its fastest step (thread CPU time on 1 thread, wall time
// on 2). A neighbour that slows the machine for a while slows all four alike, so these ratios are much
// steadier than those of separate runs.
// docs/results/optim_cpu.md has the commands and the figures.
#include "memtrain/core/rng.h"
#include "memtrain/optim/adamw.h"
#include "memtrain/optim/factories.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/optim/lion.h"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace memtrain;
using namespace memtrain::optim;

enum Kind { kAdamW, kAdamW8bit, kLion, kLion8bit };
const char* kNames[] = {"AdamW", "AdamW8bit", "Lion", "Lion8bit"};

std::vector<std::int64_t> sizes() {
  std::vector<std::int64_t> out{16'000'000, 64'000'000};
  if (const char* e = std::getenv("MEMTRAIN_BENCH_OPTIM_LARGE"); e && std::string(e) == "1") out.push_back(100'000'000);
  return out;
}

std::unique_ptr<Optimizer> make(Kind kind, const Tensor& p) {
  ParamGroup g{{p}, 1e-4, 0.01};
  switch (kind) {
    case kAdamW: return std::make_unique<AdamW>(std::vector<ParamGroup>{g});
    case kAdamW8bit: return make_adamw8bit({g});
    case kLion: g.beta2 = 0.99; return std::make_unique<Lion>(std::vector<ParamGroup>{g});
    case kLion8bit: g.beta2 = 0.99; return make_lion8bit({g});
  }
  return nullptr;
}

void BM_OptimStep(benchmark::State& state, Kind kind) {
  const std::int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
  manual_seed(1);
  Tensor p = randn({n}).set_requires_grad();
  p.set_grad(randn({n}) * 1e-2);
  auto opt = make(kind, p);
  opt->step();  // allocates the state outside the timed loop
  for (auto _ : state) {
    opt->step();
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["state_B_per_param"] = static_cast<double>(opt->state_bytes()) / static_cast<double>(n);
  omp_set_num_threads(saved_threads);
}

void register_all() {
  for (int k = 0; k < 4; ++k)
    for (std::int64_t n : sizes())
      for (int t : {1, 2})
        benchmark::RegisterBenchmark(kNames[k], BM_OptimStep, static_cast<Kind>(k))
            ->Args({n, t})
            ->ArgNames({"n", "threads"})
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
}

// Console output as usual, plus the 8-bit / fp32 AdamW ratios once every run is in.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    // With repetitions, only the medians (named "<benchmark>_median") feed the ratios.
    for (const Run& r : runs) {
      if (r.run_type == Run::RT_Aggregate) {
        if (r.aggregate_name != "median") continue;
        if (!have_medians_) times_.clear();
        have_medians_ = true;
      } else if (have_medians_) {
        continue;
      }
      times_[r.benchmark_name()] = {r.GetAdjustedRealTime(), r.GetAdjustedCPUTime()};
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    for (const auto& [name, t] : times_) {
      if (name.rfind("AdamW/", 0) != 0) continue;
      const std::string args = name.substr(5);
      for (const char* other : {"AdamW8bit", "Lion", "Lion8bit"}) {
        auto it = times_.find(other + args);
        if (it != times_.end())
          std::printf("ratio %s%s / AdamW%s = %.2f wall, %.2f cpu\n", other, args.c_str(), args.c_str(),
                      it->second.first / t.first, it->second.second / t.second);
      }
    }
  }

 private:
  std::map<std::string, std::pair<double, double>> times_;  // wall, CPU of the timing thread
  bool have_medians_ = false;
};

double thread_cpu_ns() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return 1e9 * static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec);
}

double wall_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e9 * static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec);
}

// Fastest step per optimizer over `rounds` rounds, in ns per parameter: thread CPU time on 1 thread (all the
// work is on the calling thread), wall time on more.
void run_round_robin(int rounds) {
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    std::printf("round robin, %d thread%s, fastest of %d steps each, %s ns per parameter\n", threads,
                threads > 1 ? "s" : "", rounds, threads == 1 ? "thread CPU" : "wall");
    for (std::int64_t n : sizes()) {
      std::vector<Tensor> params;
      std::vector<std::unique_ptr<Optimizer>> opts;
      for (int k = 0; k < 4; ++k) {
        manual_seed(1);
        Tensor p = randn({n}).set_requires_grad();
        p.set_grad(randn({n}) * 1e-2);
        opts.push_back(make(static_cast<Kind>(k), p));
        opts.back()->step();  // allocates the state
        params.push_back(p);
      }
      double best[4];
      std::fill(best, best + 4, std::numeric_limits<double>::infinity());
      for (int r = 0; r < rounds; ++r)
        for (int k = 0; k < 4; ++k) {
          const double t0 = threads == 1 ? thread_cpu_ns() : wall_ns();
          opts[k]->step();
          const double t1 = threads == 1 ? thread_cpu_ns() : wall_ns();
          best[k] = std::min(best[k], (t1 - t0) / static_cast<double>(n));
        }
      std::printf("n=%lld:", static_cast<long long>(n));
      for (int k = 0; k < 4; ++k) std::printf("  %s %.3f", kNames[k], best[k]);
      std::printf("  | / AdamW: AdamW8bit %.2f, Lion %.2f, Lion8bit %.2f\n", best[1] / best[0], best[2] / best[0],
                  best[3] / best[0]);
    }
  }
  omp_set_num_threads(saved_threads);
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* e = std::getenv("MEMTRAIN_BENCH_OPTIM_ROUNDS"); e && std::atoi(e) > 0) {
    run_round_robin(std::atoi(e));
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
