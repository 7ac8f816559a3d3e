// Batch norm over x (B, C, HW), forward and backward (the rule of nn::BatchNorm2d, src/nn/batch_norm.cpp).
//
// Algorithm: one block per channel (blocks loop over channels, c = blockIdx.x, += gridDim.x). Training
// forward: two passes over the channel's B * HW values for the statistics, each summed per thread in f64
// and added by a fixed-order block reduction (mean, then the biased var of the deviations: no cancellation,
// deterministic), then one pass writing y; thread 0 writes the saved statistics and updates the running
// ones. Backward: one pass for the two sums (dout, dout * x_hat) in f64, then one pass writing dx.
// Thread mapping: thread t takes elements j = t, t + blockDim, ... of the channel, j = b * HW + i, which
// lie at x[(b * C + c) * HW + i]: a warp reads consecutive i (coalesced within each image).
// A channel's whole work is one block, so a layer with few channels and large B * HW uses few SMs; good
// enough for the CNNs memtrain trains (C >= 16 from the first conv on).
#include "spatial.cuh"

namespace memtrain::cuda {

using namespace spatial_device;

namespace {

constexpr int kBnThreads = 256;  // a multiple of 32 (block_sum)

// Running-stat factors, computed on the host in f64 and rounded to f32 like the CPU's scalar arguments.
struct RunningUpdate {
  float keep, take_mean, take_var;
};

template <typename T>
__global__ void batch_norm_forward_kernel(T* y, float* save_mean, float* save_invstd, T* running_mean, T* running_var,
                                          const T* x, const T* weight, const T* bias, std::int64_t B, std::int64_t C,
                                          std::int64_t HW, bool training, RunningUpdate upd, double eps) {
  __shared__ double red[32];
  const std::int64_t n = B * HW;
  // c depends only on blockIdx.x: every thread of the block runs the same iterations (barriers below).
  for (std::int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    float mean, invstd;
    if (training) {
      double s = 0.0;
      for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const std::int64_t b = j / HW, i = j - b * HW;
        s += static_cast<double>(to_f32(x[(b * C + c) * HW + i]));
      }
      const double m = block_sum(s, red) / static_cast<double>(n);
      double v = 0.0;
      for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const std::int64_t b = j / HW, i = j - b * HW;
        const double d = static_cast<double>(to_f32(x[(b * C + c) * HW + i])) - m;
        v += d * d;
      }
      const double var = block_sum(v, red) / static_cast<double>(n);  // biased: what normalises the batch
      mean = static_cast<float>(m);
      invstd = static_cast<float>(1.0 / sqrt(var + eps));
      if (threadIdx.x == 0 && running_mean != nullptr) {
        const float vf = static_cast<float>(var);
        running_mean[c] = from_f32<T>(__fadd_rn(__fmul_rn(to_f32(running_mean[c]), upd.keep), __fmul_rn(mean, upd.take_mean)));
        running_var[c] = from_f32<T>(__fadd_rn(__fmul_rn(to_f32(running_var[c]), upd.keep), __fmul_rn(vf, upd.take_var)));
      }
    } else {
      mean = to_f32(running_mean[c]);
      invstd = static_cast<float>(1.0 / sqrt(static_cast<double>(to_f32(running_var[c])) + eps));
    }
    if (threadIdx.x == 0) {
      save_mean[c] = mean;
      save_invstd[c] = invstd;
    }
    const float scale = invstd * (weight != nullptr ? to_f32(weight[c]) : 1.0f);
    const float shift = bias != nullptr ? to_f32(bias[c]) : 0.0f;
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const std::int64_t b = j / HW, i = j - b * HW;
      const std::int64_t at = (b * C + c) * HW + i;
      y[at] = from_f32<T>((to_f32(x[at]) - mean) * scale + shift);
    }
  }
}

template <typename T>
__global__ void batch_norm_backward_kernel(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight,
                                           const float* save_mean, const float* save_invstd, std::int64_t B,
                                           std::int64_t C, std::int64_t HW, bool training) {
  __shared__ double red[32];
  const std::int64_t n = B * HW;
  for (std::int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    const float mean = save_mean[c], invstd = save_invstd[c];
    double sg = 0.0, sgx = 0.0;  // sum dout, sum dout * x_hat
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const std::int64_t b = j / HW, i = j - b * HW;
      const std::int64_t at = (b * C + c) * HW + i;
      const double g = static_cast<double>(to_f32(dout[at]));
      sg += g;
      sgx += g * static_cast<double>((to_f32(x[at]) - mean) * invstd);
    }
    sg = block_sum(sg, red);
    sgx = block_sum(sgx, red);
    if (threadIdx.x == 0) {
      if (dweight != nullptr) dweight[c] = from_f32<T>(static_cast<float>(sgx));
      if (dbias != nullptr) dbias[c] = from_f32<T>(static_cast<float>(sg));
    }
    const float scale = invstd * (weight != nullptr ? to_f32(weight[c]) : 1.0f);
    const float mean_g = training ? static_cast<float>(sg / static_cast<double>(n)) : 0.0f;
    const float mean_gx = training ? static_cast<float>(sgx / static_cast<double>(n)) : 0.0f;
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const std::int64_t b = j / HW, i = j - b * HW;
      const std::int64_t at = (b * C + c) * HW + i;
      const float xhat = (to_f32(x[at]) - mean) * invstd;
      // Training: mean and var depend on x too, hence the two projections; eval: a per-channel affine map.
      dx[at] = from_f32<T>(scale * (to_f32(dout[at]) - mean_g - xhat * mean_gx));
    }
  }
}

unsigned channel_blocks(std::int64_t C) { return static_cast<unsigned>(C < kMaxBlocks ? C : kMaxBlocks); }

}  // namespace

template <typename T>
cudaError_t launch_batch_norm_forward(T* y, float* save_mean, float* save_invstd, T* running_mean, T* running_var,
                                      const T* x, const T* weight, const T* bias, std::int64_t B, std::int64_t C,
                                      std::int64_t HW, bool training, double momentum, double eps,
                                      cudaStream_t stream) {
  if (C <= 0) return cudaSuccess;
  const double n = static_cast<double>(B * HW);
  RunningUpdate upd{static_cast<float>(1.0 - momentum), static_cast<float>(momentum),
                    n > 1.0 ? static_cast<float>(momentum * (n / (n - 1.0))) : 0.0f};
  batch_norm_forward_kernel<T><<<channel_blocks(C), kBnThreads, 0, stream>>>(
      y, save_mean, save_invstd, running_mean, running_var, x, weight, bias, B, C, HW, training, upd, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_batch_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight,
                                       const float* save_mean, const float* save_invstd, std::int64_t B,
                                       std::int64_t C, std::int64_t HW, bool training, cudaStream_t stream) {
  if (C <= 0) return cudaSuccess;
  batch_norm_backward_kernel<T><<<channel_blocks(C), kBnThreads, 0, stream>>>(
      dx, dweight, dbias, dout, x, weight, save_mean, save_invstd, B, C, HW, training);
  return cudaGetLastError();
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                   \
  template cudaError_t launch_batch_norm_forward<T>(T*, float*, float*, T*, T*, const T*, const T*, const T*,     \
                                                    std::int64_t, std::int64_t, std::int64_t, bool, double, double, \
                                                    cudaStream_t);                                                \
  template cudaError_t launch_batch_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const float*,      \
                                                     const float*, std::int64_t, std::int64_t, std::int64_t, bool, \
                                                     cudaStream_t);
MEMTRAIN_INSTANTIATE(float)
MEMTRAIN_INSTANTIATE(__nv_bfloat16)
MEMTRAIN_INSTANTIATE(__half)
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cuda
