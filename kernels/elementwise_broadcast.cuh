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

#include "memtrain/core/elementwise_ops.h"

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

// The maps by name and what each computes: memtrain/core/elementwise_ops.h, shared with the host.
using EwUnary = ::memtrain::elementwise::UnaryOp;
using EwBinary = ::memtrain::elementwise::BinaryOp;

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
