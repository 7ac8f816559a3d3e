// Softmax and log-softmax kernels over the middle axis of a contiguous array viewed as (outer, C, inner):
// element (o, c, i) sits at o*C*inner + c*inner + i. Reducing over the last dim is inner == 1. Rows are
// independent, so the outer index is split across OpenMP threads. T is float or double.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

// out = exp(x - max) / sum exp(x - max) along C.
template <typename T>
void softmax_forward(T* out, const T* x, int64_t outer, int64_t C, int64_t inner);  // (outer, C, inner)
// dx = out * (dout - sum_c dout * out); needs only the forward output.
template <typename T>
void softmax_backward(T* dx, const T* dout, const T* out, int64_t outer, int64_t C, int64_t inner);

// out = x - max - log sum exp(x - max) along C.
template <typename T>
void log_softmax_forward(T* out, const T* x, int64_t outer, int64_t C, int64_t inner);
// dx = dout - exp(out) * sum_c dout.
template <typename T>
void log_softmax_backward(T* dx, const T* dout, const T* out, int64_t outer, int64_t C, int64_t inner);

}  // namespace memtrain::cpu
