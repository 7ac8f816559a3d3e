// Launchers for the neural-net kernels: softmax and cross entropy (nn_softmax.cu), GELU, dropout and
// embedding (nn_pointwise.cu). Plain C++-callable: the host backend (src/cuda/cuda_nn.cpp) includes this
// with the C++ compiler. The norms keep their launchers beside their entries (src/cuda/norm.cu), which uses
// the device helpers at the bottom. Each launcher takes raw device pointers, sizes and a stream,
// enqueues its kernels (nothing when there is no work) and returns the first error, or
// cudaGetLastError() after the last launch, so a bad launch is reported at the call that made it.
//
// T is float, __half or __nv_bfloat16 (instantiated in the .cu files), I is std::int32_t or std::int64_t.
// f16 and bf16 data is widened to f32 for all arithmetic and rounded once (nearest even) on the way out; row
// statistics (lse) and per-row losses are always f32. Arrays are contiguous, row-major.
// Sizes are checked by the caller: N, C >= 0, N * C fits in int64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// ---- softmax, cross entropy (nn_softmax.cu) ------------------------------------------------------

// Over the last dim of (N, C): out = softmax(x), or log_softmax(x) when `is_log`.
template <typename T>
cudaError_t launch_softmax_forward(T* out, const T* x, std::int64_t N, std::int64_t C, bool is_log,
                                   cudaStream_t stream);
// softmax: dx = out * (dout - sum(dout * out)); log_softmax: dx = dout - exp(out) * sum(dout).
template <typename T>
cudaError_t launch_softmax_backward(T* dx, const T* dout, const T* out, std::int64_t N, std::int64_t C, bool is_log,
                                    cudaStream_t stream);

// losses, lse (N) from logits (N, V): lse = log sum exp(row), loss = lse - logits[n, t] (0 when
// t == ignore_index, NaN when t is outside [0, V) otherwise).
template <typename T, typename I>
cudaError_t launch_cross_entropy_forward(float* losses, float* lse, const T* logits, const I* targets, std::int64_t N,
                                         std::int64_t V, std::int64_t ignore_index, cudaStream_t stream);
// dlogits (N, V) = dloss[n * dloss_stride] * (exp(logits - lse) - onehot(t)); rows with t == ignore_index
// are 0, rows with t outside [0, V) are NaN.
template <typename T, typename I>
cudaError_t launch_cross_entropy_backward(T* dlogits, const float* dloss, std::int64_t dloss_stride, const T* logits,
                                          const float* lse, const I* targets, std::int64_t N, std::int64_t V,
                                          std::int64_t ignore_index, cudaStream_t stream);

// ---- GELU, dropout, embedding (nn_pointwise.cu) ---------------------------------------------------

// y = gelu_tanh(x) and dx = dy * gelu_tanh'(x) over n elements; y may be x, dx may be dy.
template <typename T>
cudaError_t launch_gelu_tanh_forward(T* y, const T* x, std::size_t n, cudaStream_t stream);
template <typename T>
cudaError_t launch_gelu_tanh_backward(T* dx, const T* dy, const T* x, std::size_t n, cudaStream_t stream);

// out[i] = in[i] * scale if lane (i % 4) of Philox4x32-10 block (offset + i / 4) under key `seed` is
// >= threshold (<= 2^32), else 0. out may be in. The rule of cpu/dropout.h, bit for bit.
template <typename T>
cudaError_t launch_dropout(T* out, const T* in, std::size_t n, std::uint64_t threshold, float scale,
                           std::uint64_t seed, std::uint64_t offset, cudaStream_t stream);

// out (N, C) = weight[indices[n]] from weight (V, C); a row whose index is outside [0, V) is NaN.
template <typename T, typename I>
cudaError_t launch_embedding_forward(T* out, const T* weight, const I* indices, std::int64_t N, std::int64_t V,
                                     std::int64_t C, cudaStream_t stream);
// dweight (V, C) += dout rows scattered by index, repeated indices summed in increasing n (f32, starting
// from dweight): deterministic, and for f32 bit-identical to cpu::embedding_backward. Out-of-range
// indices are skipped. Needs N <= INT32_MAX, V < 2^31 and `scratch` of embedding_backward_scratch_bytes.
template <typename T, typename I>
cudaError_t launch_embedding_backward(T* dweight, const T* dout, const I* indices, std::int64_t N, std::int64_t V,
                                      std::int64_t C, void* scratch, std::size_t scratch_bytes, cudaStream_t stream);
cudaError_t embedding_backward_scratch_bytes(std::int64_t N, std::int64_t V, std::size_t* bytes);

}  // namespace memtrain::cuda

#if defined(__CUDACC__)
#include "device_math.cuh"

// ---- device helpers shared by the nn_*.cu files and src/cuda/norm.cu (nvcc only) --------------------
namespace memtrain::cuda::nn_device {

// Row kernels loop over rows with a grid of at most this many blocks (far below gridDim.x's 2^31 - 1,
// and many waves on any GPU).
constexpr int kMaxRowBlocks = 65535;

// The conversions and reductions of every kernel file (device_math.cuh).
using device::block_max;
using device::block_sum;
using device::from_f32;
using device::to_f32;
using device::warp_max;
using device::warp_sum;

}  // namespace memtrain::cuda::nn_device

// The explicit instantiations of the nn_*.cu launchers: M(T) for every float type, M(T, I) for every float
// type and index type.
#define MEMTRAIN_NN_FOR_FLOAT_TYPES(M) M(float) M(__nv_bfloat16) M(__half)
#define MEMTRAIN_NN_FOR_FLOAT_AND_INDEX_TYPES(M)                                                               \
  M(float, std::int32_t) M(float, std::int64_t) M(__nv_bfloat16, std::int32_t) M(__nv_bfloat16, std::int64_t) \
  M(__half, std::int32_t) M(__half, std::int64_t)

namespace memtrain::cuda {
// Threads for a block that owns one row of C elements: about 4 elements per thread, a whole number of
// warps, 32 to 1024.
inline unsigned nn_row_threads(std::int64_t C) {
  const std::int64_t warps = (C + 127) / 128;
  return static_cast<unsigned>(32 * (warps < 1 ? 1 : (warps > 32 ? 32 : warps)));
}
inline unsigned nn_row_blocks(std::int64_t N) {
  return static_cast<unsigned>(N < nn_device::kMaxRowBlocks ? (N < 1 ? 1 : N) : nn_device::kMaxRowBlocks);
}
}  // namespace memtrain::cuda
#endif
