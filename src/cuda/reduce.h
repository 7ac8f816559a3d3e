// CUDA reductions behind ops::sum / mean / max / argmax / sum_to (memtrain/ops/reduce.h) and gradient
// norms, as raw-pointer entry points on contiguous row-major device buffers viewed as
// [outer, reduce, inner]: every output (o, i) reduces src[o, :, i]. The op front-ends bring any set of
// reduced dims to this layout. Conventions of memtrain/cuda/cuda.h: work goes to the device's current
// stream (stream.h) in call order, errors throw memtrain::Error("cuda::<name>: ..."), and argument errors
// throw before the device is touched. Deterministic: no float atomics; each output is added in an order
// fixed by the shape, so a rerun gives the same bits. Scratch comes from the device Allocator (workspace).
// dtype: f64, f32, f16 or bf16.
#pragma once

#include "memtrain/core/dtype.h"

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// out (outer, inner), dtype = sum over r of src (outer, reduce, inner), accumulated in f64 and rounded
// once to dtype, as the CPU's ops::sum. reduce == 0 gives zeros.
void sum_dim(const void* src, void* out, DType dtype, std::int64_t outer, std::int64_t reduce, std::int64_t inner,
             int device);

// *out (one f64 in device memory) = sum of src[i]^2 over n elements, in f64: the CPU's gradient-norm sum.
void sum_of_squares(const void* src, DType dtype, std::size_t n, double* out, int device);

// out[b] (f64, device memory) = sum of src[i]^2 over i in [block b, block (b + 1)) of n elements, in f64, for
// every b < ceil(n / block): the blocks of the canonical gradient norm.
void block_sums_of_squares(const void* src, DType dtype, std::size_t n, std::size_t block, double* out, int device);

// values (outer, inner), dtype, and indices (outer, inner), i64: the maximum over r and its first
// position, as the CPU's ops::max / argmax (a NaN beats every number; the first NaN wins). Either output
// may be null (not both). reduce must be > 0.
void max_dim(const void* src, void* values, std::int64_t* indices, DType dtype, std::int64_t outer,
             std::int64_t reduce, std::int64_t inner, int device);

}  // namespace memtrain::cuda
