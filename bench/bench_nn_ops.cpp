// Throughput of the fused nn ops through their public front-ends (allocation, dtype handling and autograd
// recording included), f32, at 1 and 2 threads (the benchmark argument).
//   attention fwd+bwd  B=4 H=12 T=256 D=64, causal: GFLOP/s counting the causal half of the GEMM work,
//                      forward 2*B*H*T^2*D, backward (5 products, S recomputed) 5*B*H*T^2*D
//   layer_norm         [8192, 768] forward, and forward + backward: GB/s of compulsory traffic
//                      (fwd: read x, write y; bwd: read dy and x, write dx)
//   softmax            [8192, 1024] over the last dim, forward: GB/s (read x, write y)
//   cross_entropy      N=2048, V=50257, mean, forward + backward: GB/s (read logits twice, write dlogits)
//   fused_linear_ce    x [1024, 256], weight [8192, 256], bias [8192], chunk 256, mean, forward + backward
//                      (the LM head): GFLOP/s counting 4 products of 2*N*V*C (logits twice, dx, dW)
//   depthwise conv2d   forward + backward (dx, dW, db), f32, EfficientNet-like layers: case 0 x [32, 96, 14, 14]
//                      3x3 s1 p1, case 1 x [32, 144, 28, 28] 5x5 s2 p2 (groups = Cin = Cout), through the raw CPU
//                      kernels (cpu/conv.h): BM_depthwise_conv is the direct-loop path conv2d takes, and
//                      BM_depthwise_conv_im2col the general im2col + GEMM path on the same shapes, its peer;
//                      GFLOP/s counting 3 products of 2*B*C*OH*OW*KH*KW (y, dx, dW)
// Run: ./bench_nn_ops [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <omp.h>

#include "cpu/conv.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/ops/nn.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using namespace memtrain;

void set_threads(benchmark::State& state) { omp_set_num_threads(static_cast<int>(state.range(0))); }

void BM_attention_fwd_bwd(benchmark::State& state) {
  set_threads(state);
  const std::int64_t B = 4, H = 12, T = 256, D = 64;
  manual_seed(1);
  Tensor q = randn({B, H, T, D}).set_requires_grad(true), k = randn({B, H, T, D}).set_requires_grad(true),
         v = randn({B, H, T, D}).set_requires_grad(true);
  const Tensor g = randn({B, H, T, D});
  for (auto _ : state) {
    Tensor out = ops::scaled_dot_product_attention(q, k, v, true);
    out.backward(g);
    benchmark::DoNotOptimize(q.grad().data_ptr());
    q.set_grad(Tensor()), k.set_grad(Tensor()), v.set_grad(Tensor());
  }
  const double flops = 7.0 * B * H * T * T * D;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_attention_fwd(benchmark::State& state) {
  set_threads(state);
  const std::int64_t B = 4, H = 12, T = 256, D = 64;
  manual_seed(2);
  const Tensor q = randn({B, H, T, D}), k = randn({B, H, T, D}), v = randn({B, H, T, D});
  for (auto _ : state) benchmark::DoNotOptimize(ops::scaled_dot_product_attention(q, k, v, true).data_ptr());
  const double flops = 2.0 * B * H * T * T * D;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_layer_norm_fwd(benchmark::State& state) {
  set_threads(state);
  const std::int64_t N = 8192, C = 768;
  manual_seed(3);
  const Tensor x = randn({N, C}), w = randn({C}), b = randn({C});
  for (auto _ : state) benchmark::DoNotOptimize(ops::layer_norm(x, w, b).data_ptr());
  state.counters["GB/s"] = benchmark::Counter(2.0 * N * C * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_layer_norm_fwd_bwd(benchmark::State& state) {
  set_threads(state);
  const std::int64_t N = 8192, C = 768;
  manual_seed(4);
  Tensor x = randn({N, C}).set_requires_grad(true), w = randn({C}).set_requires_grad(true),
         b = randn({C}).set_requires_grad(true);
  const Tensor g = randn({N, C});
  for (auto _ : state) {
    ops::layer_norm(x, w, b).backward(g);
    benchmark::DoNotOptimize(x.grad().data_ptr());
    x.set_grad(Tensor()), w.set_grad(Tensor()), b.set_grad(Tensor());
  }
  state.counters["GB/s"] = benchmark::Counter(5.0 * N * C * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_softmax_fwd(benchmark::State& state) {
  set_threads(state);
  const std::int64_t N = 8192, C = 1024;
  manual_seed(5);
  const Tensor x = randn({N, C});
  for (auto _ : state) benchmark::DoNotOptimize(ops::softmax(x).data_ptr());
  state.counters["GB/s"] = benchmark::Counter(2.0 * N * C * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_cross_entropy_fwd_bwd(benchmark::State& state) {
  set_threads(state);
  const std::int64_t N = 2048, V = 50257;
  manual_seed(6);
  Tensor logits = randn({N, V}).set_requires_grad(true);
  std::vector<std::int64_t> t(N);
  for (std::int64_t i = 0; i < N; ++i) t[i] = (i * 7919) % V;
  const Tensor targets = from_buffer(t.data(), {N}, DType::i64, DType::i64);
  for (auto _ : state) {
    ops::cross_entropy(logits, targets).backward();
    benchmark::DoNotOptimize(logits.grad().data_ptr());
    logits.set_grad(Tensor());
  }
  state.counters["GB/s"] = benchmark::Counter(3.0 * N * V * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_fused_linear_ce_fwd_bwd(benchmark::State& state) {
  set_threads(state);
  const std::int64_t N = 1024, C = 256, V = 8192, chunk = 256;
  manual_seed(7);
  Tensor x = randn({N, C}).set_requires_grad(true), w = randn({V, C}).set_requires_grad(true),
         b = randn({V}).set_requires_grad(true);
  std::vector<std::int64_t> t(N);
  for (std::int64_t i = 0; i < N; ++i) t[i] = (i * 7919) % V;
  const Tensor targets = from_buffer(t.data(), {N}, DType::i64, DType::i64);
  for (auto _ : state) {
    ops::fused_linear_cross_entropy(x, w, b, targets, ops::Reduction::mean, -100, chunk).backward();
    benchmark::DoNotOptimize(w.grad().data_ptr());
    x.set_grad(Tensor()), w.set_grad(Tensor()), b.set_grad(Tensor());
  }
  const double flops = 4.0 * 2.0 * N * V * C;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Depthwise conv2d forward + backward on raw f32 buffers; state.range(0) picks the shape, range(1) the threads.
template <bool kIm2col>
void depthwise_conv_fwd_bwd(benchmark::State& state) {
  const int nt = static_cast<int>(state.range(1));
  const std::int64_t C = state.range(0) == 0 ? 96 : 144, HW = state.range(0) == 0 ? 14 : 28;
  const std::int64_t K = state.range(0) == 0 ? 3 : 5, S = state.range(0) == 0 ? 1 : 2, P = K / 2;
  cpu::Conv2dShape s{32, C, HW, HW, C, K, K, S, P, C, 0, 0};
  s.OH = cpu::conv_out_size(HW, K, S, P);
  s.OW = s.OH;
  std::mt19937 rng(8);
  std::normal_distribution<float> dist;
  auto randv = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& e : v) e = dist(rng);
    return v;
  };
  const auto x = randv(s.B * C * HW * HW), w = randv(C * K * K), b = randv(C), dy = randv(s.B * C * s.OH * s.OW);
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(b.size());
  const cpu::ConvPath path = kIm2col ? cpu::ConvPath::im2col : cpu::ConvPath::best;
  const std::int64_t ws =
      std::max(cpu::conv2d_forward_workspace(s, nt, path), cpu::conv2d_backward_workspace(s, nt, path));
  std::vector<float> work(static_cast<std::size_t>(std::max<std::int64_t>(ws, 1)));
  for (auto _ : state) {
    cpu::conv2d_forward<float>(y.data(), x.data(), w.data(), b.data(), s, work.data(), nt, path);
    cpu::conv2d_backward<float>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), s, work.data(), nt,
                                path);
    benchmark::DoNotOptimize(dw.data());
    benchmark::ClobberMemory();
  }
  const double flops = 3.0 * 2.0 * static_cast<double>(s.B * C * s.OH * s.OW * K * K);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void BM_depthwise_conv(benchmark::State& state) { depthwise_conv_fwd_bwd<false>(state); }
void BM_depthwise_conv_im2col(benchmark::State& state) { depthwise_conv_fwd_bwd<true>(state); }

BENCHMARK(BM_attention_fwd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention_fwd_bwd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_layer_norm_fwd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_layer_norm_fwd_bwd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_softmax_fwd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cross_entropy_fwd_bwd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_fused_linear_ce_fwd_bwd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_depthwise_conv)->ArgsProduct({{0, 1}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_depthwise_conv_im2col)->ArgsProduct({{0, 1}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
