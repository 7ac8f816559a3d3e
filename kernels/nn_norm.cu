// Layer norm and RMS norm over the last dim of (N, C), forward and backward (reference: src/cpu/norm.cpp).
//
// Algorithm: one block per row (blocks loop over rows, row = blockIdx.x, += gridDim.x). Forward: two-pass
// statistics in f32 (sum -> mean, then sum of squared deviations; RMS: sum of squares), each a block
// reduction (warp shuffles, then one warp over the per-warp sums), then one pass writing the output.
// Backward: per row, one pass for the two (layer norm) or one (RMS) row sums dx needs, then one pass
// writing dx; x is read again instead of a saved normalised copy, as in llm.c.
// dweight / dbias, deterministically: the backward runs G = norm_partial_blocks(N, C) blocks; thread t of
// block b owns columns t, t + blockDim, ... of its private scratch row partials[b, :] and adds its rows'
// terms there in row order (no atomics, no sharing). A second kernel, one thread per column, sums the G
// partials in block order in f64 and rounds once to T. G depends only on (N, C), not on the device, so a
// rerun gives the same bits.
// Thread mapping: thread t of a row block handles columns t, t + blockDim, ...: each warp reads 32
// consecutive elements per step (coalesced).
#include "nn.cuh"

namespace memtrain::cuda {

using namespace nn_device;

namespace {

// Blocks of the backward when it sums dweight/dbias: about 256K threads in flight, at least 128 blocks
// and at most 1024 (the partials then take ~8 MiB for two sums at C = 4096), never more than N.
std::int64_t norm_partial_blocks(std::int64_t N, std::int64_t C) {
  const std::int64_t target = 262144 / static_cast<std::int64_t>(nn_row_threads(C));
  const std::int64_t g = target < 128 ? 128 : (target > 1024 ? 1024 : target);
  return N < g ? (N < 1 ? 1 : N) : g;
}

template <typename T>
__device__ __forceinline__ float weight_at(const T* w, std::int64_t c) {
  return w != nullptr ? to_f32(w[c]) : 1.0f;
}

template <typename T>
__global__ void layer_norm_forward_kernel(T* out, float* mean, float* rstd, const T* x, const T* weight,
                                          const T* bias, std::int64_t N, std::int64_t C, float eps) {
  __shared__ float red[32];
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    T* yr = out + row * C;
    float s = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f32(xr[c]);
    const float m = block_sum(s, red) * inv_c;
    float v = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = to_f32(xr[c]) - m;
      v += d * d;
    }
    const float r = 1.0f / sqrtf(block_sum(v, red) * inv_c + eps);
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = (to_f32(xr[c]) - m) * r;
      yr[c] = from_f32<T>(norm * weight_at(weight, c) + (bias != nullptr ? to_f32(bias[c]) : 0.0f));
    }
    if (threadIdx.x == 0) {
      if (mean != nullptr) mean[row] = m;
      if (rstd != nullptr) rstd[row] = r;
    }
  }
}

// dw_part / db_part: this launch's [gridDim.x, C] partials, or null when that sum is not wanted.
template <typename T>
__global__ void layer_norm_backward_kernel(T* dx, float* dw_part, float* db_part, const T* dout, const T* x,
                                           const T* weight, const float* mean, const float* rstd, std::int64_t N,
                                           std::int64_t C) {
  __shared__ float red[32];
  const float inv_c = 1.0f / static_cast<float>(C);
  float* dw = dw_part != nullptr ? dw_part + blockIdx.x * C : nullptr;  // this block's (C)
  float* db = db_part != nullptr ? db_part + blockIdx.x * C : nullptr;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    if (dw != nullptr) dw[c] = 0.0f;
    if (db != nullptr) db[c] = 0.0f;
  }
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    const T* gr = dout + row * C;
    T* dxr = dx + row * C;
    const float m = mean[row], r = rstd[row];
    // dnorm = dout * w; dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    float sum_dn = 0.0f, sum_dn_norm = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = (to_f32(xr[c]) - m) * r;
      const float g = to_f32(gr[c]);
      const float dn = g * weight_at(weight, c);
      sum_dn += dn;
      sum_dn_norm += dn * norm;
      if (dw != nullptr) dw[c] += g * norm;  // only this thread touches column c of this block's row
      if (db != nullptr) db[c] += g;
    }
    const float mean_dn = block_sum(sum_dn, red) * inv_c;
    const float mean_dn_norm = block_sum(sum_dn_norm, red) * inv_c;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = (to_f32(xr[c]) - m) * r;
      const float dn = to_f32(gr[c]) * weight_at(weight, c);
      dxr[c] = from_f32<T>(r * (dn - mean_dn - norm * mean_dn_norm));
    }
  }
}

template <typename T>
__global__ void rms_norm_forward_kernel(T* out, float* rstd, const T* x, const T* weight, std::int64_t N,
                                        std::int64_t C, float eps) {
  __shared__ float red[32];
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    T* yr = out + row * C;
    float ss = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float v = to_f32(xr[c]);
      ss += v * v;
    }
    const float r = 1.0f / sqrtf(block_sum(ss, red) * inv_c + eps);
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      yr[c] = from_f32<T>(to_f32(xr[c]) * r * weight_at(weight, c));
    }
    if (threadIdx.x == 0 && rstd != nullptr) rstd[row] = r;
  }
}

template <typename T>
__global__ void rms_norm_backward_kernel(T* dx, float* dw_part, const T* dout, const T* x, const T* weight,
                                         const float* rstd, std::int64_t N, std::int64_t C) {
  __shared__ float red[32];
  const float inv_c = 1.0f / static_cast<float>(C);
  float* dw = dw_part != nullptr ? dw_part + blockIdx.x * C : nullptr;  // this block's (C)
  if (dw != nullptr) {
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.0f;
  }
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    const T* gr = dout + row * C;
    T* dxr = dx + row * C;
    const float r = rstd[row];
    // dx = rstd * (dout * w - norm * mean(dout * w * norm)), norm = x * rstd
    float s = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = to_f32(xr[c]) * r;
      const float g = to_f32(gr[c]);
      s += g * weight_at(weight, c) * norm;
      if (dw != nullptr) dw[c] += g * norm;
    }
    const float mean_s = block_sum(s, red) * inv_c;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xv = to_f32(xr[c]);
      dxr[c] = from_f32<T>(r * (to_f32(gr[c]) * weight_at(weight, c) - xv * r * mean_s));
    }
  }
}

// dst[c] = sum over b < G of partials[b, c], in b order, in f64; one thread per column.
template <typename T>
__global__ void column_sum_kernel(T* dst, const float* partials, std::int64_t G, std::int64_t C) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += stride) {
    double s = 0.0;
    for (std::int64_t b = 0; b < G; ++b) s += partials[b * C + c];
    dst[c] = from_f32<T>(static_cast<float>(s));
  }
}

template <typename T>
cudaError_t launch_column_sum(T* dst, const float* partials, std::int64_t G, std::int64_t C, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const std::int64_t blocks = (C + kThreads - 1) / kThreads;
  column_sum_kernel<T><<<static_cast<unsigned>(blocks < kMaxRowBlocks ? blocks : kMaxRowBlocks), kThreads, 0,
                         stream>>>(dst, partials, G, C);
  return cudaGetLastError();
}

}  // namespace

std::size_t norm_backward_partial_floats(std::int64_t N, std::int64_t C, int sums) {
  if (N <= 0 || C <= 0 || sums <= 0) return 0;
  return static_cast<std::size_t>(norm_partial_blocks(N, C) * C * sums);
}

template <typename T>
cudaError_t launch_layer_norm_forward(T* out, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                                      std::int64_t N, std::int64_t C, float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  layer_norm_forward_kernel<T><<<nn_row_blocks(N), nn_row_threads(C), 0, stream>>>(out, mean, rstd, x, weight, bias,
                                                                                   N, C, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight,
                                       const float* mean, const float* rstd, std::int64_t N, std::int64_t C,
                                       float* partials, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  const bool sums = dweight != nullptr || dbias != nullptr;
  const std::int64_t G = sums ? norm_partial_blocks(N, C) : nn_row_blocks(N);
  float* dw_part = dweight != nullptr ? partials : nullptr;
  float* db_part = dbias != nullptr ? partials + (dweight != nullptr ? G * C : 0) : nullptr;
  layer_norm_backward_kernel<T><<<static_cast<unsigned>(G), nn_row_threads(C), 0, stream>>>(
      dx, dw_part, db_part, dout, x, weight, mean, rstd, N, C);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (dweight != nullptr) {
    if (cudaError_t err = launch_column_sum(dweight, dw_part, G, C, stream); err != cudaSuccess) return err;
  }
  if (dbias != nullptr) return launch_column_sum(dbias, db_part, G, C, stream);
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_rms_norm_forward(T* out, float* rstd, const T* x, const T* weight, std::int64_t N, std::int64_t C,
                                    float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  rms_norm_forward_kernel<T><<<nn_row_blocks(N), nn_row_threads(C), 0, stream>>>(out, rstd, x, weight, N, C, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight, const float* rstd,
                                     std::int64_t N, std::int64_t C, float* partials, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  const std::int64_t G = dweight != nullptr ? norm_partial_blocks(N, C) : nn_row_blocks(N);
  float* dw_part = dweight != nullptr ? partials : nullptr;
  rms_norm_backward_kernel<T><<<static_cast<unsigned>(G), nn_row_threads(C), 0, stream>>>(dx, dw_part, dout, x,
                                                                                          weight, rstd, N, C);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (dweight != nullptr) return launch_column_sum(dweight, dw_part, G, C, stream);
  return cudaSuccess;
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                   \
  template cudaError_t launch_layer_norm_forward<T>(T*, float*, float*, const T*, const T*, const T*, std::int64_t, \
                                                    std::int64_t, float, cudaStream_t);                           \
  template cudaError_t launch_layer_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const float*,      \
                                                     const float*, std::int64_t, std::int64_t, float*,            \
                                                     cudaStream_t);                                               \
  template cudaError_t launch_rms_norm_forward<T>(T*, float*, const T*, const T*, std::int64_t, std::int64_t,     \
                                                  float, cudaStream_t);                                           \
  template cudaError_t launch_rms_norm_backward<T>(T*, T*, const T*, const T*, const T*, const float*,            \
                                                   std::int64_t, std::int64_t, float*, cudaStream_t);
MEMTRAIN_INSTANTIATE(float)
MEMTRAIN_INSTANTIATE(__nv_bfloat16)
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cuda
