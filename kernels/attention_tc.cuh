// Launchers for the tensor-core attention kernels in attention_tc.cu: the same contract as the bf16
// launchers of attention.cuh (operands [B, H, T, D] through AttentionStrides, lse (B*H, T) f32, outputs
// overwritten, deterministic backward with a delta scratch of BH * T floats), for bf16 and f16 operands on
// devices of compute capability 8.0 or newer. The GEMMs (Q K^T, P V, and the backward's five) run on
// tensor cores with f32 accumulation; softmax statistics, lse and delta stay f32.
// Plain C++-callable. Each launcher enqueues its kernels on `stream` (nothing when BH * T == 0) and returns
// the first launch error. Sizes are checked by the caller (src/cuda/cuda_attention.cpp).
#pragma once

#include "attention.cuh"

#include <cuda_fp16.h>

#include <cstdint>

namespace memtrain::cuda {

// Head dims with a compiled tensor-core kernel.
constexpr bool attention_tc_head_dim_compiled(std::int64_t d) { return d == 32 || d == 64 || d == 128; }

// T: __nv_bfloat16 or __half (the only instantiations). D must be compiled (above).
template <typename T>
cudaError_t launch_attention_forward_tc(T* out, AttentionStrides lo, float* lse, const T* q, AttentionStrides lq,
                                        const T* k, AttentionStrides lk, const T* v, AttentionStrides lv,
                                        std::int64_t BH, std::int64_t H, std::int64_t T_len, int D, float scale,
                                        bool causal, cudaStream_t stream);

template <typename T>
cudaError_t launch_attention_backward_tc(T* dq, AttentionStrides ldq, T* dk, AttentionStrides ldk, T* dv,
                                         AttentionStrides ldv, const T* dout, AttentionStrides ldo, const T* q,
                                         AttentionStrides lq, const T* k, AttentionStrides lk, const T* v,
                                         AttentionStrides lv, const T* out, AttentionStrides lo, const float* lse,
                                         float* delta, std::int64_t BH, std::int64_t H, std::int64_t T_len, int D,
                                         float scale, bool causal, cudaStream_t stream);

// Thread blocks of the largest grid either launcher makes, for the caller's gridDim.x check.
std::int64_t attention_tc_blocks(std::int64_t BH, std::int64_t T_len);

}  // namespace memtrain::cuda
