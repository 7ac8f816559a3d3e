// Fused log-softmax + negative log-likelihood over rows of (N, V) logits. The forward keeps one
// log-sum-exp per row, so the backward rebuilds softmax(row) = exp(logit - lse) without a stored (N, V)
// probability matrix. Rows whose target equals ignore_index give loss 0 and gradient 0. I is int32_t or
// int64_t; targets are range-checked by the op front-end.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

// losses, lse: (N); logits: (N, V); targets: (N).
template <typename T, typename I>
void cross_entropy_forward(T* losses, T* lse, const T* logits, const I* targets, int64_t N, int64_t V,
                           int64_t ignore_index);
// dlogits (N, V) = dloss[n] * (softmax(logits[n]) - onehot(targets[n])); dloss[n] is read at
// dloss[n * dloss_stride] (stride 0: one scale for every row, as for mean/sum reductions).
template <typename T, typename I>
void cross_entropy_backward(T* dlogits, const T* dloss, int64_t dloss_stride, const T* logits, const T* lse,
                            const I* targets, int64_t N, int64_t V, int64_t ignore_index);

}  // namespace memtrain::cpu
