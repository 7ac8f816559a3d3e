// Launchers for the broadcasting elementwise kernels in elementwise_broadcast.cu: unary maps (math,
// activations, tensor-scalar arithmetic), binary maps (arithmetic and the backward rules of the unary
// ops), where (a bitwise select) and comparisons. Plain C++-callable (the host backend,
// src/cuda/cuda_elementwise.cpp, includes this with the C++ compiler).
//
// Every kernel writes a contiguous row-major output of `n` elements over the index space of `layout`;
// each input is read at sum(i_d * strides[k][d]) from its own base pointer (strides in elements, 0 on a
// broadcast dim, any sign). The host merges dims first, so ndim is 1..kElementwiseMaxDims. Each launcher
// enqueues one kernel (nothing when n == 0) and returns cudaGetLastError(), or cudaErrorInvalidValue for
// an op, format or element size it does not take.
// Floating formats are computed in f32 (f16, bf16, f32) or f64 (f64) and rounded once on the way out,
// like the CPU ops (which widen bf16/f16 to f32).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

inline constexpr int kElementwiseMaxDims = 8;

// The index space (shape[0, ndim), row-major; the product of the extents is the launcher's n) and the
// strides of each of the kInputs inputs. Travels to the kernel by value as a kernel parameter.
template <int kInputs>
struct ElementwiseLayout {
  int ndim = 1;
  std::int64_t shape[kElementwiseMaxDims] = {};
  std::int64_t strides[kInputs][kElementwiseMaxDims] = {};
};

enum class EwFormat { f32, f64, f16, bf16 };

// out = f(x; p0, p1). The scalars are rounded to the compute type first, like the CPU's static_cast<T>(s).
enum class EwUnary {
  add_scalar,  // x + p0
  mul_scalar,  // x * p0
  rdiv_scalar, // p0 / x
  neg,
  abs,
  exp,
  log,
  sqrt,
  rsqrt,       // 1 / sqrt(x)
  pow,         // x^p0 (x * x when p0 == 2)
  tanh,
  sigmoid,     // overflow-free: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below
  relu,        // x < 0 ? 0 : x (NaN stays NaN)
  gelu_erf,    // 0.5 x (1 + erf(x / sqrt 2))
  gelu_tanh,   // x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); f64: 0.5 x (1 + tanh u)
  silu,        // x sigmoid(x)
  clamp,       // x < p0 ? p0 : (x > p1 ? p1 : x)
};

// out = f(a, b; p0, p1). The *_backward rules take a = dy (the output gradient) and b = the tensor the
// forward saved (x, or y where the derivative is cheaper from the output), as in src/ops/unary.cpp.
enum class EwBinary {
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

// Comparisons write bool bytes 0/1. Input types as the CPU compares them: floats widened (bf16/f16 to
// f32), integers as themselves, bool by truth (any nonzero byte is true).
enum class EwCompareType { f32, f64, f16, bf16, i8, u8, i32, i64, boolean };
enum class EwCompare { gt, lt };  // against a double scalar: the value widened to double, compared exactly

cudaError_t launch_elementwise_unary(EwUnary op, EwFormat format, void* out, const void* x,
                                     const ElementwiseLayout<1>& layout, std::uint64_t n, double p0, double p1,
                                     cudaStream_t stream);
cudaError_t launch_elementwise_binary(EwBinary op, EwFormat format, void* out, const void* a, const void* b,
                                      const ElementwiseLayout<2>& layout, std::uint64_t n, double p0, double p1,
                                      cudaStream_t stream);
// out = cond != 0 ? a : b, elements of elem_size bytes (1, 2, 4 or 8) copied bit for bit; cond bytes.
cudaError_t launch_elementwise_where(void* out, const std::uint8_t* cond, const void* a, const void* b,
                                     const ElementwiseLayout<3>& layout, std::uint64_t n, std::size_t elem_size,
                                     cudaStream_t stream);
// out = op(x, s) (boolean type not taken: the CPU refuses it too).
cudaError_t launch_elementwise_compare_scalar(EwCompare op, EwCompareType type, std::uint8_t* out, const void* x,
                                              const ElementwiseLayout<1>& layout, std::uint64_t n, double s,
                                              cudaStream_t stream);
// out = (a == b); floats compare in their compute type, bools by truth.
cudaError_t launch_elementwise_eq(EwCompareType type, std::uint8_t* out, const void* a, const void* b,
                                  const ElementwiseLayout<2>& layout, std::uint64_t n, cudaStream_t stream);

}  // namespace memtrain::cuda
