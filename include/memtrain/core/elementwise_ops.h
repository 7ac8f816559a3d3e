// The elementwise maps by name, one list for every layer that speaks of them: the backend contract
// (src/core/backend.h: Backend::UnaryOp / BinaryOp), the CUDA host entry points (memtrain/cuda/
// elementwise.h) and the CUDA kernels (kernels/elementwise_broadcast.cuh). Named, since a lambda cannot
// run on every device. Plain enums with no includes, so nvcc-compiled kernels include it too; the CPU
// maps (src/cpu/elementwise.cpp) and the kernels (kernels/elementwise_broadcast.cu) implement each name.
#pragma once

namespace memtrain::elementwise {

// out = f(x; p0, p1). p0/p1 are rounded to the compute type first (x + p0, not x + (double)p0), like the
// CPU's static_cast<T>(s).
enum class UnaryOp {
  add_scalar,   // x + p0
  mul_scalar,   // x * p0
  rdiv_scalar,  // p0 / x
  neg,
  abs,
  exp,
  log,
  sqrt,
  rsqrt,        // 1 / sqrt(x)
  pow,          // x^p0 (x * x when p0 == 2)
  tanh,
  sigmoid,      // overflow-free: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below
  relu,         // x < 0 ? 0 : x (NaN stays NaN)
  gelu_erf,     // x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
  gelu_tanh,    // GPT-2's tanh approximation: x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
  silu,         // x sigmoid(x)
  clamp,        // to [p0, p1]: x < p0 ? p0 : (x > p1 ? p1 : x), NaN stays NaN
};

// out = f(a, b; p0, p1). The *_backward rules are dx = f(a = dy, b = saved), with b the forward's input
// x (abs, pow [p0 = exponent], clamp [p0, p1 = bounds], gelu_erf, gelu_tanh, silu) or its output y
// (tanh, sigmoid, relu, sqrt, rsqrt), as in src/ops/unary.cpp.
enum class BinaryOp {
  add,
  sub,
  mul,
  div,
  abs_backward,        // b > 0 ? a : (b < 0 ? -a : 0), b = x
  pow_backward,        // p0 == 0 ? 0 : a * p0 * b^(p0 - 1), b = x
  tanh_backward,       // a (1 - b^2), b = y
  sigmoid_backward,    // a b (1 - b), b = y
  relu_backward,       // b > 0 ? a : 0, b = y
  sqrt_backward,       // a * 0.5 / b, b = y
  rsqrt_backward,      // a * -0.5 * b^3, b = y
  clamp_backward,      // p0 <= b <= p1 ? a : 0, b = x
  gelu_erf_backward,   // a (Phi(b) + b phi(b)), b = x
  gelu_tanh_backward,  // a (s + 2 b s (1 - s) u'), s = sigmoid(2u); f64 from tanh; b = x
  silu_backward,       // a s (1 + b (1 - s)), s = sigmoid(b), b = x
};

// The last name of each list, for range checks on a value that came through an int.
inline constexpr UnaryOp kLastUnaryOp = UnaryOp::clamp;
inline constexpr BinaryOp kLastBinaryOp = BinaryOp::silu_backward;

}  // namespace memtrain::elementwise
