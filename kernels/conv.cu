// The data-movement kernels of conv2d around a GEMM (see conv.cuh for the layouts).
//
// Thread mapping: every kernel but the bias gradient is elementwise, one thread per element of its
// output, in a grid-stride loop with 64-bit indices (a column buffer can pass 2^31 elements); consecutive
// threads take consecutive output elements, so writes are coalesced. col2im gathers instead of
// scattering: each dx element adds its at most KH * KW column entries itself, in (kh, kw) order, so no
// atomics and the same bits on every run. The bias gradient runs one block per channel (blocks loop over
// channels); threads sum strided elements of the channel in f64 and a block reduction adds them in a
// fixed order.
#include "conv.cuh"
#include "spatial.cuh"

namespace memtrain::cuda {

using namespace spatial_device;

namespace {

template <typename T>
__global__ void im2col_kernel(float* col, const T* x, std::int64_t nb, ConvGeometry g) {
  const std::int64_t L = g.OH * g.OW, cols = nb * L, KK = g.KH * g.KW;
  const std::int64_t total = g.Cin * KK * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, j = i - r * cols;  // col (row r, column j)
    const std::int64_t ci = r / KK, kk = r - ci * KK, kh = kk / g.KW, kw = kk - kh * g.KW;
    const std::int64_t bi = j / L, l = j - bi * L, oh = l / g.OW, ow = l - oh * g.OW;
    const std::int64_t ih = oh * g.stride - g.padding + kh, iw = ow * g.stride - g.padding + kw;
    float v = 0.0f;
    if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) v = to_f32(x[((bi * g.Cin + ci) * g.H + ih) * g.W + iw]);
    col[i] = v;
  }
}

template <typename T>
__global__ void col2im_kernel(T* dx, const float* col, std::int64_t nb, ConvGeometry g) {
  const std::int64_t L = g.OH * g.OW, cols = nb * L, KK = g.KH * g.KW;
  const std::int64_t total = nb * g.Cin * g.H * g.W;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t iw = i % g.W, ih = (i / g.W) % g.H, ci = (i / (g.W * g.H)) % g.Cin;
    const std::int64_t bi = i / (g.W * g.H * g.Cin);
    float s = 0.0f;
    for (std::int64_t kh = 0; kh < g.KH; ++kh) {
      const std::int64_t th = ih + g.padding - kh;  // = oh * stride when (ih, kh) belongs to output row oh
      if (th < 0 || th % g.stride != 0) continue;
      const std::int64_t oh = th / g.stride;
      if (oh >= g.OH) continue;
      for (std::int64_t kw = 0; kw < g.KW; ++kw) {
        const std::int64_t tw = iw + g.padding - kw;
        if (tw < 0 || tw % g.stride != 0) continue;
        const std::int64_t ow = tw / g.stride;
        if (ow >= g.OW) continue;
        s += col[(ci * KK + kh * g.KW + kw) * cols + bi * L + oh * g.OW + ow];
      }
    }
    dx[i] = from_f32<T>(s);
  }
}

template <typename T>
__global__ void to_channel_major_kernel(float* dst, const T* src, std::int64_t nb, std::int64_t C, std::int64_t L) {
  const std::int64_t cols = nb * L, total = C * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t c = i / cols, j = i - c * cols, bi = j / L, l = j - bi * L;
    dst[i] = to_f32(src[(bi * C + c) * L + l]);
  }
}

template <typename T>
__global__ void from_channel_major_kernel(T* dst, const float* src, const T* bias, std::int64_t nb, std::int64_t C,
                                          std::int64_t L) {
  const std::int64_t total = nb * C * L;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t l = i % L, c = (i / L) % C, bi = i / (L * C);
    const float b = bias != nullptr ? to_f32(bias[c]) : 0.0f;
    dst[i] = from_f32<T>(src[c * nb * L + bi * L + l] + b);
  }
}

template <typename T>
__global__ void bias_add_kernel(T* out, const T* bias, std::int64_t B, std::int64_t C, std::int64_t L) {
  const std::int64_t total = B * C * L;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t c = (i / L) % C;
    out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[c]));
  }
}

// blockDim.x == kThreads (a multiple of 32); c depends only on blockIdx.x, so every thread of a block runs
// the same iterations and reaches the barriers of block_sum.
template <typename T>
__global__ void bias_grad_kernel(T* dbias, const T* dout, std::int64_t B, std::int64_t C, std::int64_t L) {
  __shared__ double red[32];
  const std::int64_t n = B * L;
  for (std::int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double s = 0.0;
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const std::int64_t b = j / L, l = j - b * L;
      s += static_cast<double>(to_f32(dout[(b * C + c) * L + l]));
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) dbias[c] = from_f32<T>(static_cast<float>(s));
  }
}

template <typename T>
__global__ void widen_kernel(float* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = to_f32(src[i]);
}

template <typename T>
__global__ void narrow_kernel(T* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f32<T>(src[i]);
}

}  // namespace

template <typename T>
cudaError_t launch_conv_im2col(float* col, const T* x, std::int64_t nb, const ConvGeometry& g, cudaStream_t stream) {
  return launch_flat(im2col_kernel<T>, g.Cin * g.KH * g.KW * nb * g.OH * g.OW, stream, col, x, nb, g);
}

template <typename T>
cudaError_t launch_conv_col2im(T* dx, const float* col, std::int64_t nb, const ConvGeometry& g, cudaStream_t stream) {
  return launch_flat(col2im_kernel<T>, nb * g.Cin * g.H * g.W, stream, dx, col, nb, g);
}

template <typename T>
cudaError_t launch_conv_to_channel_major(float* dst, const T* src, std::int64_t nb, std::int64_t C, std::int64_t L,
                                         cudaStream_t stream) {
  return launch_flat(to_channel_major_kernel<T>, nb * C * L, stream, dst, src, nb, C, L);
}

template <typename T>
cudaError_t launch_conv_from_channel_major(T* dst, const float* src, const T* bias, std::int64_t nb, std::int64_t C,
                                           std::int64_t L, cudaStream_t stream) {
  return launch_flat(from_channel_major_kernel<T>, nb * C * L, stream, dst, src, bias, nb, C, L);
}

template <typename T>
cudaError_t launch_conv_bias_add(T* out, const T* bias, std::int64_t B, std::int64_t C, std::int64_t L,
                                 cudaStream_t stream) {
  return launch_flat(bias_add_kernel<T>, B * C * L, stream, out, bias, B, C, L);
}

template <typename T>
cudaError_t launch_conv_bias_grad(T* dbias, const T* dout, std::int64_t B, std::int64_t C, std::int64_t L,
                                  cudaStream_t stream) {
  if (C <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(C < kMaxBlocks ? C : kMaxBlocks);
  bias_grad_kernel<T><<<blocks, kThreads, 0, stream>>>(dbias, dout, B, C, L);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_conv_widen(float* dst, const T* src, std::int64_t n, cudaStream_t stream) {
  return launch_flat(widen_kernel<T>, n, stream, dst, src, n);
}

template <typename T>
cudaError_t launch_conv_narrow(T* dst, const float* src, std::int64_t n, cudaStream_t stream) {
  return launch_flat(narrow_kernel<T>, n, stream, dst, src, n);
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                     \
  template cudaError_t launch_conv_im2col<T>(float*, const T*, std::int64_t, const ConvGeometry&, cudaStream_t);  \
  template cudaError_t launch_conv_col2im<T>(T*, const float*, std::int64_t, const ConvGeometry&, cudaStream_t);  \
  template cudaError_t launch_conv_to_channel_major<T>(float*, const T*, std::int64_t, std::int64_t, std::int64_t, \
                                                       cudaStream_t);                                              \
  template cudaError_t launch_conv_from_channel_major<T>(T*, const float*, const T*, std::int64_t, std::int64_t,   \
                                                         std::int64_t, cudaStream_t);                              \
  template cudaError_t launch_conv_bias_add<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t,             \
                                               cudaStream_t);                                                      \
  template cudaError_t launch_conv_bias_grad<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t,            \
                                                cudaStream_t);                                                     \
  template cudaError_t launch_conv_widen<T>(float*, const T*, std::int64_t, cudaStream_t);                         \
  template cudaError_t launch_conv_narrow<T>(T*, const float*, std::int64_t, cudaStream_t);
MEMTRAIN_INSTANTIATE(float)
MEMTRAIN_INSTANTIATE(__nv_bfloat16)
MEMTRAIN_INSTANTIATE(__half)
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cuda
