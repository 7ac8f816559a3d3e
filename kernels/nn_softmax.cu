// Softmax / log-softmax over the last dim of (N, C) and fused cross entropy over (N, V) logits, forward
// and backward (references: src/cpu/softmax.cpp with inner == 1, src/cpu/cross_entropy.cpp).
//
// Algorithm: one block per row (blocks loop over rows). Forwards: pass 1 the row max, pass 2 the sum of
// exp(x - max), both block reductions in f32, then one pass writing the output (cross entropy writes
// only lse and the loss, from thread 0). Backwards: softmax needs one row sum first, cross entropy none
// (it rebuilds softmax from the saved lse). Full-precision expf/logf (no fast-math intrinsics).
// Thread mapping: thread t of a row block handles columns t, t + blockDim, ... (coalesced); blocks of up
// to 1024 threads, so a GPT-2 vocabulary row (V = 50304) is ~49 elements per thread per pass.
#include "nn.cuh"

namespace memtrain::cuda {

using namespace nn_device;

namespace {

// Max and sum of exp(x - max) over one row, returned to every thread of the block.
template <typename T>
__device__ __forceinline__ void row_max_sumexp(const T* xr, std::int64_t C, float* red, float& mx, float& s) {
  float m = __int_as_float(0xff800000);  // -inf
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, to_f32(xr[c]));
  mx = block_max(m, red);
  float acc = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += expf(to_f32(xr[c]) - mx);
  s = block_sum(acc, red);
}

template <typename T>
__global__ void softmax_forward_kernel(T* out, const T* x, std::int64_t N, std::int64_t C, bool is_log) {
  __shared__ float red[32];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;  // (C)
    T* yr = out + row * C;
    float mx = 0.0f, s = 0.0f;
    row_max_sumexp(xr, C, red, mx, s);
    if (is_log) {
      const float ls = logf(s);
      for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = from_f32<T>((to_f32(xr[c]) - mx) - ls);
    } else {
      const float inv = 1.0f / s;
      for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = from_f32<T>(expf(to_f32(xr[c]) - mx) * inv);
    }
  }
}

template <typename T>
__global__ void softmax_backward_kernel(T* dx, const T* dout, const T* out, std::int64_t N, std::int64_t C,
                                        bool is_log) {
  __shared__ float red[32];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* gr = dout + row * C;  // (C)
    const T* yr = out + row * C;
    T* dxr = dx + row * C;
    float acc = 0.0f;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      acc += is_log ? to_f32(gr[c]) : to_f32(gr[c]) * to_f32(yr[c]);
    }
    const float s = block_sum(acc, red);
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = to_f32(gr[c]), y = to_f32(yr[c]);
      dxr[c] = from_f32<T>(is_log ? g - expf(y) * s : y * (g - s));
    }
  }
}

template <typename T, typename I>
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const T* logits, const I* targets,
                                             std::int64_t N, std::int64_t V, std::int64_t ignore_index) {
  __shared__ float red[32];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = logits + row * V;  // (V)
    float mx = 0.0f, s = 0.0f;
    row_max_sumexp(xr, V, red, mx, s);
    if (threadIdx.x == 0) {
      const float l = mx + logf(s);
      if (lse != nullptr) lse[row] = l;
      const std::int64_t t = static_cast<std::int64_t>(targets[row]);
      // An out-of-range target (the op front-end checks them) gives NaN rather than a read out of bounds.
      losses[row] = t == ignore_index ? 0.0f : (t >= 0 && t < V ? l - to_f32(xr[t]) : __int_as_float(0x7fc00000));
    }
  }
}

template <typename T, typename I>
__global__ void cross_entropy_backward_kernel(T* dlogits, const float* dloss, std::int64_t dloss_stride,
                                              const T* logits, const float* lse, const I* targets, std::int64_t N,
                                              std::int64_t V, std::int64_t ignore_index) {
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = logits + row * V;  // (V)
    T* dxr = dlogits + row * V;
    const std::int64_t t = static_cast<std::int64_t>(targets[row]);
    if (t == ignore_index) {
      for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) dxr[c] = from_f32<T>(0.0f);
      continue;  // no barrier in this kernel: a block may take different paths per row
    }
    const bool valid = t >= 0 && t < V;
    const float g = dloss[row * dloss_stride], l = lse[row];
    for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) {
      // g * softmax, then - g at the target: the CPU's two roundings (__fmul_rn keeps them unfused).
      float d = __fmul_rn(g, expf(to_f32(xr[c]) - l));
      if (c == t) d -= g;
      dxr[c] = from_f32<T>(valid ? d : __int_as_float(0x7fc00000));
    }
  }
}

}  // namespace

template <typename T>
cudaError_t launch_softmax_forward(T* out, const T* x, std::int64_t N, std::int64_t C, bool is_log,
                                   cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  softmax_forward_kernel<T><<<nn_row_blocks(N), nn_row_threads(C), 0, stream>>>(out, x, N, C, is_log);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_softmax_backward(T* dx, const T* dout, const T* out, std::int64_t N, std::int64_t C, bool is_log,
                                    cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  softmax_backward_kernel<T><<<nn_row_blocks(N), nn_row_threads(C), 0, stream>>>(dx, dout, out, N, C, is_log);
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t launch_cross_entropy_forward(float* losses, float* lse, const T* logits, const I* targets, std::int64_t N,
                                         std::int64_t V, std::int64_t ignore_index, cudaStream_t stream) {
  if (N <= 0 || V <= 0) return cudaSuccess;
  cross_entropy_forward_kernel<T, I><<<nn_row_blocks(N), nn_row_threads(V), 0, stream>>>(losses, lse, logits, targets,
                                                                                         N, V, ignore_index);
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t launch_cross_entropy_backward(T* dlogits, const float* dloss, std::int64_t dloss_stride, const T* logits,
                                          const float* lse, const I* targets, std::int64_t N, std::int64_t V,
                                          std::int64_t ignore_index, cudaStream_t stream) {
  if (N <= 0 || V <= 0) return cudaSuccess;
  cross_entropy_backward_kernel<T, I><<<nn_row_blocks(N), nn_row_threads(V), 0, stream>>>(
      dlogits, dloss, dloss_stride, logits, lse, targets, N, V, ignore_index);
  return cudaGetLastError();
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                  \
  template cudaError_t launch_softmax_forward<T>(T*, const T*, std::int64_t, std::int64_t, bool, cudaStream_t);  \
  template cudaError_t launch_softmax_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, bool,      \
                                                  cudaStream_t);
#define MEMTRAIN_INSTANTIATE_CE(T, I)                                                                            \
  template cudaError_t launch_cross_entropy_forward<T, I>(float*, float*, const T*, const I*, std::int64_t,      \
                                                          std::int64_t, std::int64_t, cudaStream_t);             \
  template cudaError_t launch_cross_entropy_backward<T, I>(T*, const float*, std::int64_t, const T*,             \
                                                           const float*, const I*, std::int64_t, std::int64_t,   \
                                                           std::int64_t, cudaStream_t);
MEMTRAIN_NN_FOR_FLOAT_TYPES(MEMTRAIN_INSTANTIATE)
MEMTRAIN_NN_FOR_FLOAT_AND_INDEX_TYPES(MEMTRAIN_INSTANTIATE_CE)
#undef MEMTRAIN_INSTANTIATE_CE
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cuda
