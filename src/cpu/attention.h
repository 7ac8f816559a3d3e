// Scaled dot-product attention, FlashAttention-2 style, on [B, H, T, D] operands whose heads are laid out
// by a HeadLayout (unit stride along D; any strides for batch, head and time), so head views of a fused
// QKV projection are read without a copy. Forward: each task owns one (head, query tile of kTileQ rows);
// it streams key/value tiles of kTileK rows, forms the score tile S = scale * Q K^T with a GEMM, and keeps a running max m and sum l per
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

// Where the heads of a [B, H, T, D] operand live: element (b, h, t, d) at b * batch + h * head + t * row + d.
// A contiguous tensor is {H * T * D, T * D, D}; a head view of a [B, T, H * D] projection (reshape +
// transpose, no copy) is {T * H * D, D, H * D}, which the kernels read in place.
struct HeadLayout {
  int64_t batch = 0, head = 0, row = 0;
};

// out, q, k, v: [B, H, T, D] through their layouts; lse: contiguous (B, H, T). scale multiplies the scores.
template <typename T>
void attention_forward(T* out, const HeadLayout& lo, T* lse, const T* q, const HeadLayout& lq, const T* k,
                       const HeadLayout& lk, const T* v, const HeadLayout& lv, int64_t B, int64_t H, int64_t T_len,
                       int64_t D, double scale, bool causal, T* workspace, int nthreads);
// dq, dk, dv: overwritten, laid out like dq_layout / dk_layout / dv_layout; dout laid out as ldo.
template <typename T>
void attention_backward(T* dq, const HeadLayout& ldq, T* dk, const HeadLayout& ldk, T* dv, const HeadLayout& ldv,
                        const T* dout, const HeadLayout& ldo, const T* q, const HeadLayout& lq, const T* k,
                        const HeadLayout& lk, const T* v, const HeadLayout& lv, const T* out, const HeadLayout& lo,
                        const T* lse, int64_t B, int64_t H, int64_t T_len, int64_t D, double scale, bool causal,
                        T* workspace, int nthreads);

}  // namespace memtrain::cpu
