// nf4_linear (W in NF4, dequantised tile by tile) against ops::linear with the weight in f32 / bf16, forward plus
// the input gradient (the QLoRA base layer's work in a step: W is frozen), at GPT-2's MLP shape: W [3072, 768],
// x [1024, 768]. Also the dequantiser alone per CPU path. Medians of 5 repetitions:
//   bench_nf4 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include "cpu/nf4_kernels.h"
#include "memtrain/core/rng.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nf4.h"
#include "memtrain/ops/reduce.h"

#include <benchmark/benchmark.h>

namespace {

using namespace memtrain;

constexpr std::int64_t kOut = 3072, kIn = 768, kRows = 1024;

DType dtype_of(const benchmark::State& state) { return state.range(0) == 0 ? DType::f32 : DType::bf16; }

// One forward and dx: sum(y) gives dy = ones without a loss kernel worth timing.
void step(benchmark::State& state, const std::function<Tensor(const Tensor&)>& layer) {
  manual_seed(1);
  const DType dtype = dtype_of(state);
  const Tensor x0 = randn({kRows, kIn}).to(dtype);
  for (auto _ : state) {
    Tensor x = x0.detach().set_requires_grad(true);
    ops::sum(layer(x)).backward();
    benchmark::DoNotOptimize(x.grad().data_ptr());
  }
  state.SetLabel(dtype == DType::f32 ? "f32" : "bf16");
}

void BM_Nf4Linear(benchmark::State& state) {
  manual_seed(2);
  const ops::Nf4Weight w = ops::nf4_quantize(randn({kOut, kIn}));
  step(state, [&](const Tensor& x) { return ops::nf4_linear(x, w); });
}
BENCHMARK(BM_Nf4Linear)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_DenseLinear(benchmark::State& state) {
  manual_seed(2);
  const Tensor w = randn({kOut, kIn}).to(dtype_of(state));  // frozen: no dW
  step(state, [&](const Tensor& x) { return ops::linear(x, w); });
}
BENCHMARK(BM_DenseLinear)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The whole matrix dequantised by one path (0 scalar, 1 AVX2, 2 AVX-512), f32 out.
void BM_Nf4Dequantize(benchmark::State& state) {
  const auto path = static_cast<cpu::nf4::DequantPath>(state.range(0));
  if (!cpu::nf4::path_supported(path)) {
    state.SkipWithError("path not supported by this CPU");
    return;
  }
  manual_seed(3);
  const ops::Nf4Weight w = ops::nf4_quantize(randn({kOut, kIn}));
  const cpu::nf4::DequantPath chosen = cpu::nf4::dequant_path();
  cpu::nf4::set_dequant_path(path);
  for (auto _ : state) benchmark::DoNotOptimize(ops::nf4_dequantize(w, DType::f32).data_ptr());
  cpu::nf4::set_dequant_path(chosen);
  state.SetBytesProcessed(state.iterations() * kOut * kIn * 4);
}
BENCHMARK(BM_Nf4Dequantize)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
