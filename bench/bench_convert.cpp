// Throughput of bulk dtype conversion (cpu::convert), f32 <-> bf16 / f16 / e4m3, in bytes moved per second
// (bytes read + bytes written). Arg: element count. Thread count follows OMP_NUM_THREADS.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/convert.h"
#include "memtrain/core/dtype.h"

namespace {

using memtrain::DType;

void bench_convert(benchmark::State& state, DType src_type, DType dst_type) {
  const auto n = static_cast<std::size_t>(state.range(0));
  // Source values: normal-distributed f32 (typical activations), converted into the source dtype once.
  std::vector<float> values(n);
  std::mt19937 rng(0);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (auto& v : values) v = dist(rng);
  std::vector<unsigned char> src(n * memtrain::dtype_size(src_type));
  std::vector<unsigned char> dst(n * memtrain::dtype_size(dst_type));
  memtrain::cpu::convert(values.data(), DType::f32, src.data(), src_type, n);
  for (auto _ : state) {
    memtrain::cpu::convert(src.data(), src_type, dst.data(), dst_type, n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(src.size() + dst.size()));
}

// 1<<14 stays on one thread (below the OpenMP threshold); 1<<22 (16 MiB of f32) runs in parallel.
#define MT_BENCH_CONVERT(name, s, d) \
  BENCHMARK_CAPTURE(bench_convert, name, s, d)->Arg(1 << 14)->Arg(1 << 22)->UseRealTime()

MT_BENCH_CONVERT(f32_to_bf16, DType::f32, DType::bf16);
MT_BENCH_CONVERT(bf16_to_f32, DType::bf16, DType::f32);
MT_BENCH_CONVERT(f32_to_f16, DType::f32, DType::f16);
MT_BENCH_CONVERT(f16_to_f32, DType::f16, DType::f32);
MT_BENCH_CONVERT(f32_to_e4m3, DType::f32, DType::f8_e4m3);
MT_BENCH_CONVERT(e4m3_to_f32, DType::f8_e4m3, DType::f32);
MT_BENCH_CONVERT(f64_to_f32, DType::f64, DType::f32);
MT_BENCH_CONVERT(f32_to_f32_memcpy, DType::f32, DType::f32);

}  // namespace

BENCHMARK_MAIN();
