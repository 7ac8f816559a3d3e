// CUDA kernels of the elementwise ops (memtrain/ops/elementwise.h) with NumPy broadcasting and arbitrary
// input strides: unary maps, binary maps (arithmetic and the backward rules of the unary ops), where, and
// comparisons. Each matches the CPU op of the same name (src/ops/binary.cpp, unary.cpp, select.cpp), the
// reference its tests compare with. Conventions are those of memtrain/cuda/cuda.h: work goes to the
// device's current stream (stream.h) in call order, a launch error throws at once, errors are
// memtrain::Error("cuda::<name>: ..."), and argument errors throw before the device is touched. Without
// CUDA every entry point throws "cuda::<name>: memtrain was built without CUDA".
//
// Layout contract, shared by every entry point: `out` is contiguous row-major over shape[0, ndim)
// (ndim >= 0; 0 is one element; any rank). Each input points at its element of index 0 and is read at
// sum(i_d * strides[d]) (strides in elements, any sign; 0 on a broadcast dim), so a broadcast or
// transposed view is read in place. Nothing happens when an extent is 0. out may be an input only when
// that input has the same contiguous layout (an in-place op); other overlaps are not allowed.
// Float dtypes: f32, f64, f16, bf16; f16/bf16/f32 are computed in f32 and f64 in f64, rounded once.
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/core/elementwise_ops.h"

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// The maps by name (memtrain/core/elementwise_ops.h: what each computes).
using UnaryOp = ::memtrain::elementwise::UnaryOp;
using BinaryOp = ::memtrain::elementwise::BinaryOp;

enum class CompareOp { gt, lt };

// out (dtype) = op(x). dtype: f32, f64, f16, bf16.
void elementwise_unary(UnaryOp op, void* out, const void* x, const std::int64_t* x_strides,
                       const std::int64_t* shape, int ndim, DType dtype, double p0, double p1, int device);
// out (dtype) = op(a, b); a and b have dtype too.
void elementwise_binary(BinaryOp op, void* out, const void* a, const std::int64_t* a_strides, const void* b,
                        const std::int64_t* b_strides, const std::int64_t* shape, int ndim, DType dtype, double p0,
                        double p1, int device);
// out = cond ? a : b, bit for bit. cond: bool bytes (any nonzero byte is true); a, b, out: elements of
// elem_size bytes (1, 2, 4 or 8), so one call serves every dtype of that size.
void where(void* out, const void* cond, const std::int64_t* cond_strides, const void* a, const std::int64_t* a_strides,
           const void* b, const std::int64_t* b_strides, const std::int64_t* shape, int ndim, std::size_t elem_size,
           int device);
// out (bool bytes 0/1) = x > s or x < s, the value widened exactly to double. dtype: f32, f64, f16, bf16,
// i8, u8, i32, i64.
void compare_scalar(CompareOp op, void* out, const void* x, const std::int64_t* x_strides, const std::int64_t* shape,
                    int ndim, DType dtype, double s, int device);
// out (bool bytes 0/1) = a == b: floats in their compute type, integers as themselves, bools by truth.
// dtype: those of compare_scalar, and boolean.
void eq(void* out, const void* a, const std::int64_t* a_strides, const void* b, const std::int64_t* b_strides,
        const std::int64_t* shape, int ndim, DType dtype, int device);

}  // namespace memtrain::cuda
