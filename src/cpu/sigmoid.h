// sigmoid, SiLU and SiLU's backward on contiguous arrays. libm's expf is scalar and its callers' branches
// (a stable sigmoid picks e^-x or e^x by sign) keep GCC from vectorizing the element maps; these kernels run
// f32 eight lanes at a time on cpu/fast_exp.h's exp, with z = e^-|x| <= 1 so nothing overflows:
//   sigmoid(x) = 1 / (1 + z) for x >= 0, z / (1 + z) below,
//   silu(x) = x sigmoid(x),  silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
// f64 keeps std::exp (it serves gradient checks). Threads: OpenMP over blocks of the flat array; the scalar
// tail goes through the same lanes, so an element's result does not depend on its position.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

// y[i] = sigmoid(x[i]) / silu(x[i]), i < n.
template <typename T>
void sigmoid_forward(T* y, const T* x, int64_t n);
template <typename T>
void silu_forward(T* y, const T* x, int64_t n);
// dx[i] = dy[i] * silu'(x[i]), i < n.
template <typename T>
void silu_backward(T* dx, const T* dy, const T* x, int64_t n);

}  // namespace memtrain::cpu
