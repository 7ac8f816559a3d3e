// Launchers for the attention kernels in attention.cu: causal or full scaled dot-product attention,
// FlashAttention-2 style, forward and backward, on [B, H, T, D] operands addressed through per-operand
// strides (unit stride along D), so head views of a fused QKV projection are read in place.
// Plain C++-callable (the host backend includes this with the C++ compiler). Each launcher enqueues its
// kernels on `stream` (nothing when BH * T == 0) and returns the first launch error, so a bad launch is
// reported at the call that made it. Sizes are checked by the caller (src/cuda/cuda_attention.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

namespace memtrain::cuda {

// Element (b, h, t, d) of an operand lives at b * batch + h * head + t * row + d (in elements).
struct AttentionStrides {
  std::int64_t batch = 0, head = 0, row = 0;
};

// Head dims with a compiled kernel.
constexpr bool attention_head_dim_compiled(std::int64_t d) { return d == 32 || d == 64 || d == 128; }
// For the launchers: f(std::integral_constant<int, D>{}) for a compiled head dim D, else
// cudaErrorInvalidValue.
template <typename F>
cudaError_t with_head_dim(int D, F&& f) {
  switch (D) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return cudaErrorInvalidValue;
  }
}

// out (B, H, T, D) through lo; lse: contiguous (B*H, T) f32, lse = log(sum_j exp(scale * q.k_j)).
// BH = B * H; H splits a flat head index into (batch, head). D must be compiled (above).
cudaError_t launch_attention_forward_f32(float* out, AttentionStrides lo, float* lse, const float* q,
                                         AttentionStrides lq, const float* k, AttentionStrides lk, const float* v,
                                         AttentionStrides lv, std::int64_t BH, std::int64_t H, std::int64_t T,
                                         int D, float scale, bool causal, cudaStream_t stream);
cudaError_t launch_attention_forward_bf16(__nv_bfloat16* out, AttentionStrides lo, float* lse,
                                          const __nv_bfloat16* q, AttentionStrides lq, const __nv_bfloat16* k,
                                          AttentionStrides lk, const __nv_bfloat16* v, AttentionStrides lv,
                                          std::int64_t BH, std::int64_t H, std::int64_t T, int D, float scale,
                                          bool causal, cudaStream_t stream);

// dq, dk, dv overwritten. delta: device scratch of BH * T floats (rowsum(dout * out), written here).
// Deterministic: no atomics (dK/dV per key tile, dQ in a separate pass per query tile).
cudaError_t launch_attention_backward_f32(float* dq, AttentionStrides ldq, float* dk, AttentionStrides ldk,
                                          float* dv, AttentionStrides ldv, const float* dout, AttentionStrides ldo,
                                          const float* q, AttentionStrides lq, const float* k, AttentionStrides lk,
                                          const float* v, AttentionStrides lv, const float* out,
                                          AttentionStrides lo, const float* lse, float* delta, std::int64_t BH,
                                          std::int64_t H, std::int64_t T, int D, float scale, bool causal,
                                          cudaStream_t stream);
cudaError_t launch_attention_backward_bf16(__nv_bfloat16* dq, AttentionStrides ldq, __nv_bfloat16* dk,
                                           AttentionStrides ldk, __nv_bfloat16* dv, AttentionStrides ldv,
                                           const __nv_bfloat16* dout, AttentionStrides ldo, const __nv_bfloat16* q,
                                           AttentionStrides lq, const __nv_bfloat16* k, AttentionStrides lk,
                                           const __nv_bfloat16* v, AttentionStrides lv, const __nv_bfloat16* out,
                                           AttentionStrides lo, const float* lse, float* delta, std::int64_t BH,
                                           std::int64_t H, std::int64_t T, int D, float scale, bool causal,
                                           cudaStream_t stream);

// Thread blocks each launcher needs (the largest of its grids), so the caller can refuse sizes whose
// grid would pass gridDim.x's limit of 2^31 - 1.
std::int64_t attention_forward_blocks(std::int64_t BH, std::int64_t T, int D);
std::int64_t attention_backward_blocks(std::int64_t BH, std::int64_t T, int D);

}  // namespace memtrain::cuda
