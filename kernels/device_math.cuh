// Device helpers shared by the kernels/*.cu files (nvcc only): the f32 <-> storage conversions of the
// float kernels, and the warp / block sums and maxima. Fixed butterflies and fixed orders: the same
// additions in the same order on every run, so every reduction built on them is deterministic.
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace memtrain::cuda::device {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

// Round to nearest even; f16 overflow goes to Inf, as the CPU's f16 rounding (core/float_types.h).
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// op over the warp, returned to every lane.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// op over the block, returned to every thread; `empty` fills the lanes past the last warp. blockDim.x must
// be a multiple of 32 (<= 1024) and every thread of the block must call it; `red` is __shared__ T[32]. The
// leading __syncthreads lets consecutive calls reuse `red`.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* red, T empty, Op op) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return warp_reduce(lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : empty, op);
}

// Sums (T = float or double) and f32 maxima over the warp or the block, as warp_reduce / block_reduce.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  return warp_reduce(v, SumOp{});
}
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, MaxOp{}); }
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  return block_reduce(v, red, T(0), SumOp{});
}
__device__ __forceinline__ float block_max(float v, float* red) {
  return block_reduce(v, red, __int_as_float(0xff800000), MaxOp{});  // -inf from the lanes past the last warp
}

// Sum over a block of kWarps warps (blockDim.x == 32 * kWarps), valid in thread 0 only: the warps' sums
// added in warp order. Ends with a barrier, so callers may loop and call again; `shared` is
// __shared__ double[kWarps].
template <int kWarps>
__device__ __forceinline__ double block_sum_to_thread0(double v, double* shared) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarps; ++w) total += shared[w];
  }
  __syncthreads();
  return total;
}

}  // namespace memtrain::cuda::device
#endif  // __CUDACC__
