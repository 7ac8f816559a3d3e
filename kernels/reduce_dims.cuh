// Launchers for reduce_dims.cu: sum (or sum of squares) and max/argmax of a contiguous row-major
// [outer, reduce, inner] array along its middle axis. The host side (src/cuda/cuda_reduce.cpp) brings any
// reduction of memtrain/ops/reduce.h to that layout. Plain C++-callable: raw device pointers, 64-bit
// sizes, a stream; each launcher enqueues its kernels and returns cudaGetLastError().
#pragma once

#include "convert.cuh"  // FloatFormat

#include <cuda_runtime_api.h>

#include <cstdint>

namespace memtrain::cuda {

// How a sum splits its reduce axis: `chunks` pieces of `chunk_len` elements (the last may be shorter).
// chunks == 1: one pass writes the outputs. chunks > 1: pass 1 writes outer * chunks * inner f64 partials,
// pass 2 adds each output's partials in chunk order. The plan depends only on the shape, so a given shape
// always sums in the same order: the same bits on every run and every device.
struct SumPlan {
  std::int64_t chunks = 1;
  std::int64_t chunk_len = 0;
};
SumPlan plan_sum_dim(std::int64_t outer, std::int64_t reduce, std::int64_t inner);
// f64 scratch a sum with this plan needs (0 when chunks == 1).
std::int64_t sum_dim_partials(const SumPlan& plan, std::int64_t outer, std::int64_t inner);

// out[o * inner + i] = sum over r of src[(o * reduce + r) * inner + i] (of its square when `square`),
// accumulated in f64 and rounded once to out_format (all zeros when reduce == 0).
// Formats: src f64/f32/f16/bf16; out_format == src_format, or f64 when square.
// partials: sum_dim_partials(plan, ...) doubles of scratch (may be null when that is 0).
cudaError_t launch_sum_dim(const void* src, FloatFormat src_format, void* out, FloatFormat out_format, bool square,
                           std::int64_t outer, std::int64_t reduce, std::int64_t inner, const SumPlan& plan,
                           double* partials, cudaStream_t stream);

// values[o * inner + i] (src_format) and indices[...] (i64): the maximum over r and its first position; a
// NaN beats every number, so the first NaN wins. Either output may be null. reduce > 0.
cudaError_t launch_max_dim(const void* src, FloatFormat src_format, void* values, std::int64_t* indices,
                           std::int64_t outer, std::int64_t reduce, std::int64_t inner, cudaStream_t stream);

}  // namespace memtrain::cuda
