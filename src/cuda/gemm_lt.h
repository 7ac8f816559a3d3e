// Row-major GEMM through cuBLASLt: mixed input/output types (f32, TF32, bf16, f16, fp8 with per-tensor
// scales), strided batches and fused epilogues (bias, GELU). The plain cuda::gemm in cuda.h stays the
// simple f32/bf16 path; this one is for the precision policies and the fused linear layers.
//
//   C[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b])      for b in [0, batch)
//   op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is [k, n] (B stored [n, k] when trans_b),
//   C is [m, n]; lda/ldb/ldc are row strides in elements; A[b] = a + b * stride_a (elements), etc.
//   epilogue: none | bias (+ bias[j] on every row of every batch: n elements of c_type) | gelu (tanh form,
//   0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))) | bias_gelu (bias first, then gelu).
//
// Supported (a_type x b_type -> c_type), all accumulated in f32:
//   f32 x f32 -> f32 (allow_tf32: TF32 tensor cores may be used; no effect for other inputs)
//   bf16 x bf16 -> bf16 | f32          f16 x f16 -> f16 | f32
//   f8_e4m3 x f8_e4m3 | f8_e4m3 x f8_e5m2 -> bf16 | f32, compute capability 8.9 or newer, with
//   cuBLASLt's fp8 rules: trans_a == false and trans_b == true (both operands k-contiguous, cuBLASLt's
//   "TN"), k, lda, ldb multiples of 16, n * sizeof(c_type), ldc * sizeof(c_type) and the batch strides
//   multiples of 16 bytes, a, b, c, bias and the scales 16-byte aligned; a bias needs a bf16 output.
//   a_scale / b_scale (nullable: 1) point to one f32 each on the device, the dequantization scales: the
//   product uses a_scale * A and b_scale * B.
//   c_scale and amax_d exist for fp8 outputs, which gemm_lt does not produce yet: they must be null.
// Anything else is refused with an Error naming "cuda::gemm_lt" before cuBLASLt is called; argument
// errors are reported before the device is looked at. beta == 0: C is not read (it may hold NaN).
// k must be >= 1. Enqueued on the device's current stream (stream.h), like every memtrain CUDA call.
#pragma once

#include "memtrain/core/dtype.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace memtrain::cuda {

enum class GemmEpilogue : std::uint8_t { none, bias, gelu, bias_gelu };

struct GemmLtArgs {
  using Epilogue = GemmEpilogue;

  DType a_type = DType::f32;
  DType b_type = DType::f32;
  DType c_type = DType::f32;  // the output (and, when beta != 0, the input C)
  bool allow_tf32 = false;    // f32 inputs only: TF32 tensor cores instead of full f32
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t batch = 1;                              // strided batch count
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batches (A, B may be 0)
  float alpha = 1.f;
  float beta = 0.f;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;  // n elements of c_type on the device; required by bias / bias_gelu only
  const float* a_scale = nullptr;  // fp8 inputs only
  const float* b_scale = nullptr;  // fp8 inputs only
  const float* c_scale = nullptr;  // reserved for fp8 outputs: must be null
  float* amax_d = nullptr;         // reserved for fp8 outputs: must be null
};

// Runs the GEMM described by `args` on cuda:`device`. a, b, c are device pointers. The algorithm is
// chosen by cuBLASLt's heuristic once per shape (types, transposes, sizes, strides, epilogue, pointer
// alignment) and cached; the workspace comes from the device allocator (MemoryCategory::workspace).
void gemm_lt(const GemmLtArgs& args, const void* a, const void* b, void* c, int device);

// Device time, for benchmarks: records a CUDA event on cuda:`device`'s current stream, then for
// i in [0, reps) calls work(i) (which must enqueue its work on that stream) and records another event;
// waits for the last one and returns the `reps` elapsed times in milliseconds. Nothing synchronizes
// between reps, so back-to-back kernels are timed without launch gaps when the host keeps ahead.
std::vector<float> time_reps_ms(int device, int reps, const std::function<void(int)>& work);

}  // namespace memtrain::cuda
