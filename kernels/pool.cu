// 2-D max and average pooling over (planes, H, W), forward and backward (reference: src/cpu/pool.cpp).
//
// Thread mapping: one thread per output element (forward) or per input element (backward), grid-stride
// loops with 64-bit indices, consecutive threads on consecutive elements. The backward gathers: input
// element (ih, iw) belongs to the windows oh in [ceil((ih + p - k + 1) / s), floor((ih + p) / s)] (clamped
// to [0, OH)), likewise for ow; it adds their gradients in (oh, ow) order, the order in which the CPU adds
// them, so no atomics are needed and results are deterministic. Max recomputes each window's argmax from
// x with the CPU's rule (first maximum, NaN wins) instead of storing indices.
#include "spatial.cuh"

namespace memtrain::cuda {

using namespace spatial_device;

namespace {

// ih * W + iw of the first maximum of window (oh, ow) of plane xp, or -1 when the window is all padding.
template <typename T>
__device__ std::int64_t window_argmax(const T* xp, const PoolGeometry& g, std::int64_t oh, std::int64_t ow) {
  std::int64_t best = -1;
  float best_v = -INFINITY;
  for (std::int64_t kh = 0; kh < g.kernel; ++kh) {
    const std::int64_t ih = oh * g.stride - g.padding + kh;
    if (ih < 0 || ih >= g.H) continue;
    for (std::int64_t kw = 0; kw < g.kernel; ++kw) {
      const std::int64_t iw = ow * g.stride - g.padding + kw;
      if (iw < 0 || iw >= g.W) continue;
      const float v = to_f32(xp[ih * g.W + iw]);
      if (best < 0 || v > best_v || (v != v && best_v == best_v)) {  // NaN propagates, as on the CPU
        best = ih * g.W + iw;
        best_v = v;
      }
    }
  }
  return best;
}

// The windows along one dim that contain input position i: [*lo, *hi] (empty when lo > hi).
__device__ __forceinline__ void window_range(std::int64_t i, const PoolGeometry& g, std::int64_t out_size,
                                             std::int64_t* lo, std::int64_t* hi) {
  const std::int64_t t = i + g.padding;  // window o covers t iff o * s <= t <= o * s + k - 1
  const std::int64_t first = t - g.kernel + 1;
  std::int64_t l = first <= 0 ? 0 : (first + g.stride - 1) / g.stride;
  std::int64_t h = t / g.stride;
  if (h > out_size - 1) h = out_size - 1;
  *lo = l;
  *hi = h;
}

template <typename T>
__global__ void max_pool_forward_kernel(T* out, const T* x, PoolGeometry g) {
  const std::int64_t total = g.planes * g.OH * g.OW;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, p = i / (g.OW * g.OH);
    const T* xp = x + p * g.H * g.W;  // (H, W)
    const std::int64_t a = window_argmax(xp, g, oh, ow);
    out[i] = from_f32<T>(a < 0 ? -INFINITY : to_f32(xp[a]));
  }
}

template <typename T>
__global__ void avg_pool_forward_kernel(T* out, const T* x, PoolGeometry g) {
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const std::int64_t total = g.planes * g.OH * g.OW;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, p = i / (g.OW * g.OH);
    const T* xp = x + p * g.H * g.W;
    float acc = 0.0f;
    for (std::int64_t kh = 0; kh < g.kernel; ++kh) {
      const std::int64_t ih = oh * g.stride - g.padding + kh;
      if (ih < 0 || ih >= g.H) continue;
      for (std::int64_t kw = 0; kw < g.kernel; ++kw) {
        const std::int64_t iw = ow * g.stride - g.padding + kw;
        if (iw >= 0 && iw < g.W) acc += to_f32(xp[ih * g.W + iw]);
      }
    }
    out[i] = from_f32<T>(__fmul_rn(acc, inv));
  }
}

template <typename T>
__global__ void max_pool_backward_kernel(T* dx, const T* dout, const T* x, PoolGeometry g) {
  const std::int64_t total = g.planes * g.H * g.W;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t iw = i % g.W, ih = (i / g.W) % g.H, p = i / (g.W * g.H);
    const T* xp = x + p * g.H * g.W;
    const T* gp = dout + p * g.OH * g.OW;  // (OH, OW)
    std::int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g, g.OH, &oh0, &oh1);
    window_range(iw, g, g.OW, &ow0, &ow1);
    const std::int64_t self = ih * g.W + iw;
    float s = 0.0f;
    for (std::int64_t oh = oh0; oh <= oh1; ++oh)
      for (std::int64_t ow = ow0; ow <= ow1; ++ow)
        if (window_argmax(xp, g, oh, ow) == self) s += to_f32(gp[oh * g.OW + ow]);
    dx[i] = from_f32<T>(s);
  }
}

template <typename T>
__global__ void avg_pool_backward_kernel(T* dx, const T* dout, PoolGeometry g) {
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const std::int64_t total = g.planes * g.H * g.W;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t iw = i % g.W, ih = (i / g.W) % g.H, p = i / (g.W * g.H);
    const T* gp = dout + p * g.OH * g.OW;
    std::int64_t oh0, oh1, ow0, ow1;
    window_range(ih, g, g.OH, &oh0, &oh1);
    window_range(iw, g, g.OW, &ow0, &ow1);
    float s = 0.0f;
    for (std::int64_t oh = oh0; oh <= oh1; ++oh)
      for (std::int64_t ow = ow0; ow <= ow1; ++ow) s += __fmul_rn(to_f32(gp[oh * g.OW + ow]), inv);  // CPU: g * inv, then +=
    dx[i] = from_f32<T>(s);
  }
}

}  // namespace

template <typename T>
cudaError_t launch_max_pool2d_forward(T* out, const T* x, const PoolGeometry& g, cudaStream_t stream) {
  return launch_flat(max_pool_forward_kernel<T>, g.planes * g.OH * g.OW, stream, out, x, g);
}

template <typename T>
cudaError_t launch_avg_pool2d_forward(T* out, const T* x, const PoolGeometry& g, cudaStream_t stream) {
  return launch_flat(avg_pool_forward_kernel<T>, g.planes * g.OH * g.OW, stream, out, x, g);
}

template <typename T>
cudaError_t launch_max_pool2d_backward(T* dx, const T* dout, const T* x, const PoolGeometry& g, cudaStream_t stream) {
  return launch_flat(max_pool_backward_kernel<T>, g.planes * g.H * g.W, stream, dx, dout, x, g);
}

template <typename T>
cudaError_t launch_avg_pool2d_backward(T* dx, const T* dout, const PoolGeometry& g, cudaStream_t stream) {
  return launch_flat(avg_pool_backward_kernel<T>, g.planes * g.H * g.W, stream, dx, dout, g);
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                   \
  template cudaError_t launch_max_pool2d_forward<T>(T*, const T*, const PoolGeometry&, cudaStream_t);           \
  template cudaError_t launch_avg_pool2d_forward<T>(T*, const T*, const PoolGeometry&, cudaStream_t);           \
  template cudaError_t launch_max_pool2d_backward<T>(T*, const T*, const T*, const PoolGeometry&, cudaStream_t); \
  template cudaError_t launch_avg_pool2d_backward<T>(T*, const T*, const PoolGeometry&, cudaStream_t);
MEMTRAIN_INSTANTIATE(float)
MEMTRAIN_INSTANTIATE(__nv_bfloat16)
MEMTRAIN_INSTANTIATE(__half)
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cuda
