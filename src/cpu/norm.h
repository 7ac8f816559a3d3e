// Layer norm and RMS norm over the last dim of a contiguous (N, C) array, llm.c style: the forward writes
// the per-row statistics the backward needs (mean, rstd), the backward reads x again instead of a saved
// normalised copy. Rows are split across OpenMP threads; dweight/dbias are summed per thread and then
// reduced in thread order (deterministic for a given thread count). weight/bias may be null (no affine).
#pragma once

#include <cstdint>

namespace memtrain::cpu {

template <typename T>
void layer_norm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias, int64_t N, int64_t C,
                        double eps);  // out, x: (N, C); mean, rstd: (N); weight, bias: (C)
// dx: (N, C) overwritten; dweight, dbias: (C) overwritten (skipped when null).
template <typename T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight, const T* mean,
                         const T* rstd, int64_t N, int64_t C);

// out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
template <typename T>
void rms_norm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int64_t C, double eps);
template <typename T>
void rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight, const T* rstd, int64_t N,
                       int64_t C);

}  // namespace memtrain::cpu
