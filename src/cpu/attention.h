// Scaled dot-product attention, FlashAttention-2 style, on contiguous (BH, T, D) arrays (BH = batch *
// heads). Forward: each task owns one (head, query tile of kTileQ rows); it streams key/value tiles of
// kTileK rows, forms the score tile S = scale * Q K^T with a GEMM, and keeps a running max m and sum l per
// row (online softmax), rescaling the output accumulator (which lives in `out` itself) when m grows. Only
// one score tile per thread is ever alive, never the T x T matrix; the per-row lse = m + log(l) is written
// for the backward. Backward: per head (one thread each, so dq/dk/dv need no atomics), loop over key tiles
// and, inside, the query tiles that can see them; P = exp(S - lse) is recomputed from q, k and lse, then
// dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ += scale dS K, dK += scale dS^T Q.
// Causal masking skips tiles wholly above the diagonal. T is float or double; GEMMs go through cpu::gemm.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

inline constexpr int64_t kAttentionTileQ = 64;
inline constexpr int64_t kAttentionTileK = 64;

// Elements of T scratch the forward / backward need (front-ends allocate them as workspace).
int64_t attention_forward_workspace(int64_t T_len, int64_t D, int nthreads);
int64_t attention_backward_workspace(int64_t T_len, int64_t D, int nthreads);

// out: (BH, T, D); lse: (BH, T); q, k, v: (BH, T, D). scale multiplies the scores.
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t BH, int64_t T_len, int64_t D,
                       double scale, bool causal, T* workspace, int nthreads);
// dq, dk, dv: (BH, T, D), overwritten.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, int64_t BH, int64_t T_len, int64_t D, double scale, bool causal, T* workspace,
                        int nthreads);

}  // namespace memtrain::cpu
