// Optimizer step throughput: AdamW, AdamW8bit, Lion, Lion8bit over one flat parameter of 16M and 64M
// elements (100M too with MEMTRAIN_BENCH_OPTIM_LARGE=1), on 1 and 2 OpenMP threads. Counters: parameters/s
// and bytes of optimizer state per parameter. At the end it prints each step time over the fp32 AdamW step
// time at the same size and thread count (target for the 8-bit ones <= 1.5), from the medians when run with
// --benchmark_repetitions. docs/results/optim_cpu.md has the command and the figures.
#include "memtrain/core/rng.h"
#include "memtrain/optim/adamw.h"
#include "memtrain/optim/factories.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/optim/lion.h"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

namespace {

using namespace memtrain;
using namespace memtrain::optim;

enum Kind { kAdamW, kAdamW8bit, kLion, kLion8bit };
const char* kNames[] = {"AdamW", "AdamW8bit", "Lion", "Lion8bit"};

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
  std::vector<std::int64_t> sizes{16'000'000, 64'000'000};
  if (const char* e = std::getenv("MEMTRAIN_BENCH_OPTIM_LARGE"); e && std::string(e) == "1") sizes.push_back(100'000'000);
  for (int k = 0; k < 4; ++k)
    for (std::int64_t n : sizes)
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
      times_[r.benchmark_name()] = r.GetAdjustedRealTime();
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
          std::printf("ratio %s%s / AdamW%s = %.2f\n", other, args.c_str(), args.c_str(), it->second / t);
      }
    }
  }

 private:
  std::map<std::string, double> times_;
  bool have_medians_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all();
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
