// Scaled dot-product attention on CUDA (FlashAttention-2 style), forward and backward: the device twin of
// cpu::attention_forward / cpu::attention_backward (src/cpu/attention.h), with the same math and operand
// layout. Raw device pointers, the device's current stream, errors as in memtrain/cuda/cuda.h; without CUDA
// every function throws "cuda::<name>: memtrain was built without CUDA".
//
// Operands are [B, H, T, D] with unit stride along D and any (non-negative) strides for batch, head and
// time, given by a HeadLayout, so head views of a fused [B, T, 3, H, D] QKV projection are read and
// written in place. dtype: f32, bf16 or f16 (16-bit operands; f32 accumulation, softmax statistics and lse).
// D: 32, 64 or 128. The T x T score matrix is never stored; the backward recomputes it from q, k and lse.
// Outputs must not overlap each other or the inputs.
// Kernels: f32 runs on CUDA cores (f32 FMA); bf16 and f16 run their GEMMs on tensor cores (compute capability
// 8.0+, f32 accumulation; P and dS are rounded to the operand dtype before their GEMMs, as FlashAttention-2
// does). bf16 can be switched to the CUDA-core kernels (set_attention_kernels) so the two can be compared;
// on a device older than 8.0 bf16 always takes them, and f16 is refused.
#pragma once

#include "memtrain/core/dtype.h"

#include <cstdint>

namespace memtrain::cuda {

// Where the heads of a [B, H, T, D] operand live (in elements): element (b, h, t, d) at
// b * batch + h * head + t * row + d. Contiguous: {H * T * D, T * D, D}; a head view of a [B, T, H * D]
// projection: {T * H * D, D, H * D}; of a fused [B, T, 3 * H * D] QKV projection: {3 T H D, D, 3 H D}.
struct HeadLayout {
  std::int64_t batch = 0, head = 0, row = 0;
};

// out = softmax(scale * q k^T [masked: key > query when causal]) v: out, q, k, v [B, H, T, D] through their
// layouts; lse (B, H, T) contiguous f32, lse = log(sum_j exp(scale * q . k_j)) over the visible keys j.
void attention_forward(void* out, const HeadLayout& lo, float* lse, const void* q, const HeadLayout& lq,
                       const void* k, const HeadLayout& lk, const void* v, const HeadLayout& lv, std::int64_t B,
                       std::int64_t H, std::int64_t T, std::int64_t D, double scale, bool causal, DType dtype,
                       int device);

// Gradients of attention_forward: dq, dk, dv [B, H, T, D] overwritten (through ldq / ldk / ldv) from dout
// (laid out as ldo) and the forward's q, k, v, out and lse. Deterministic (no atomics). Takes
// B * H * T * 4 bytes of scratch (category workspace) from the device's allocator for rowsum(dout * out).
void attention_backward(void* dq, const HeadLayout& ldq, void* dk, const HeadLayout& ldk, void* dv,
                        const HeadLayout& ldv, const void* dout, const HeadLayout& ldo, const void* q,
                        const HeadLayout& lq, const void* k, const HeadLayout& lk, const void* v,
                        const HeadLayout& lv, const void* out, const HeadLayout& lo, const float* lse,
                        std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, double scale, bool causal,
                        DType dtype, int device);

// Which kernels bf16 attention runs: `automatic` (tensor cores where the device has them) or `cuda_cores`
// (the f32-FMA kernels that f32 uses). Process-wide, for tests and benchmarks that compare the two; f32 and
// f16 ignore it. Works without CUDA (it is only a setting).
enum class AttentionKernels { automatic, cuda_cores };
void set_attention_kernels(AttentionKernels kernels);
AttentionKernels attention_kernels();

// True when attention_forward / attention_backward with this dtype and head dim on `device` take the
// tensor-core kernels under the current setting. Throws as the entry points do for a missing device.
bool attention_uses_tensor_cores(DType dtype, std::int64_t D, int device);

}  // namespace memtrain::cuda
