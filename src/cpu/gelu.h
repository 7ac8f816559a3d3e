// GELU with GPT-2's tanh approximation on contiguous arrays: the forward and its fused backward.
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
// f32 uses the identity 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^-2u), so one vectorized exp
// (cpu/fast_exp.h) replaces libm's scalar tanhf, and 1 + tanh(u) never cancels. f64 keeps std::tanh (it
// serves gradient checks). Threads: OpenMP over blocks of the flat array.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

// y[i] = gelu(x[i]), i < n.
template <typename T>
void gelu_tanh_forward(T* y, const T* x, int64_t n);
// dx[i] = dy[i] * gelu'(x[i]), i < n.
template <typename T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, int64_t n);

}  // namespace memtrain::cpu
