// Launchers for the pooling (pool.cu) and batch-norm (batch_norm.cu) kernels over NCHW arrays, plus the
// device helpers they and conv.cu share. Plain C++-callable: raw device pointers, sizes and a stream; each
// launcher enqueues its kernels (nothing when there is no work) and returns cudaGetLastError().
// T is float, __half or __nv_bfloat16: widened to f32 for arithmetic, rounded once to T on output. Sizes are
// checked by the caller (>= 0, products fit in int64).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace memtrain::cuda {

// ---- pooling over (planes, H, W) with square windows (cpu/pool.h) ----

struct PoolGeometry {
  std::int64_t planes, H, W, kernel, stride, padding, OH, OW;
};

// Max: the first maximum of each window in (kh, kw) order wins, a NaN wins over numbers; an all-padding
// window gives -inf. Avg: the window sum (in kh, kw order) times 1 / kernel^2 (padding counts).
template <typename T>
cudaError_t launch_max_pool2d_forward(T* out, const T* x, const PoolGeometry& g, cudaStream_t stream);
template <typename T>
cudaError_t launch_avg_pool2d_forward(T* out, const T* x, const PoolGeometry& g, cudaStream_t stream);
// dx (planes, H, W) overwritten. Each dx element gathers, in (oh, ow) order, from the windows containing
// it (max: only those whose recomputed argmax it is): deterministic, no atomics.
template <typename T>
cudaError_t launch_max_pool2d_backward(T* dx, const T* dout, const T* x, const PoolGeometry& g, cudaStream_t stream);
template <typename T>
cudaError_t launch_avg_pool2d_backward(T* dx, const T* dout, const PoolGeometry& g, cudaStream_t stream);

// ---- batch norm over x (B, C, HW), per channel c ----

// Training: mean[c] and invstd[c] = 1 / sqrt(var + eps) of the batch (biased var; two passes in f64),
// written to save_mean / save_invstd (C, f32); running_mean / running_var (C, T; both null or both set)
// become (1 - momentum) * running + momentum * stat, the var taking the unbiased var (n / (n - 1)).
// Eval: save_mean / save_invstd = running_mean and 1 / sqrt(running_var + eps) (running stats only read).
// Training needs B * HW >= 2 (the unbiased var), checked by the caller.
// Both: y = (x - mean) * (invstd * weight) + bias (weight / bias may be null: 1 / 0).
template <typename T>
cudaError_t launch_batch_norm_forward(T* y, float* save_mean, float* save_invstd, T* running_mean, T* running_var,
                                      const T* x, const T* weight, const T* bias, std::int64_t B, std::int64_t C,
                                      std::int64_t HW, bool training, double momentum, double eps, cudaStream_t stream);
// x_hat = (x - mean) * invstd with the forward's saved mean / invstd. dweight[c] = sum dout * x_hat and
// dbias[c] = sum dout (overwritten, skipped when null). dx (overwritten): training,
// w * invstd * (dout - mean(dout) - x_hat * mean(dout * x_hat)); eval, dout * w * invstd.
template <typename T>
cudaError_t launch_batch_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight,
                                       const float* save_mean, const float* save_invstd, std::int64_t B,
                                       std::int64_t C, std::int64_t HW, bool training, cudaStream_t stream);

}  // namespace memtrain::cuda

#if defined(__CUDACC__)
#include "device_math.cuh"

namespace memtrain::cuda::spatial_device {

// Elementwise kernels: 256 threads per block, grid-stride loops over a grid of at most kMaxBlocks.
constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;
inline unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}
// kernel<<<grid_for(total), kThreads, 0, stream>>>(args...) and its launch error; nothing when total <= 0.
template <typename... Params, typename... Args>
cudaError_t launch_flat(void (*kernel)(Params...), std::int64_t total, cudaStream_t stream, const Args&... args) {
  if (total <= 0) return cudaSuccess;
  kernel<<<grid_for(total), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

// The conversions and reductions of every kernel file (device_math.cuh).
using device::block_sum;
using device::from_f32;
using device::to_f32;

}  // namespace memtrain::cuda::spatial_device
#endif
