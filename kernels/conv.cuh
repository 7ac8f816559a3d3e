// Launchers for the kernels of conv.cu: the pieces of conv2d (NCHW) around a GEMM, used by the im2col
// fallback of src/cuda/cuda_conv.cpp (and the bias kernels by its cuDNN path too). Plain C++-callable:
// raw device pointers, sizes, a stream; each enqueues its kernel (nothing when there is no work) and
// returns cudaGetLastError().
//
// T is float or __nv_bfloat16. Column buffers are always f32, so the fallback multiplies in f32 whatever
// T is (as the CPU does: it widens bf16 to f32) and rounds once to T at the end.
// Layouts for a chunk of nb images starting at image 0 of the pointers passed in, L = OH * OW:
//   x (nb, Cin, H, W); col (Cin * KH * KW, nb * L), row ci * KH * KW + kh * KW + kw, column bi * L + l;
//   channel-major (C, nb * L), column bi * L + l: what a GEMM over the whole chunk reads and writes.
// Sizes are checked by the caller (all >= 1, products fit in int64).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace memtrain::cuda {

// The geometry every conv kernel needs (cuda::Conv2dShape without the batch and the output channels).
struct ConvGeometry {
  std::int64_t Cin, H, W, KH, KW, stride, padding, OH, OW;
};

// col = im2col(x) for nb images; padded positions are 0.
template <typename T>
cudaError_t launch_conv_im2col(float* col, const T* x, std::int64_t nb, const ConvGeometry& g, cudaStream_t stream);
// dx (nb, Cin, H, W) = col2im(col), overwritten: each dx element gathers (in kh, kw order) the column
// entries that im2col copied it to. Deterministic, no atomics.
template <typename T>
cudaError_t launch_conv_col2im(T* dx, const float* col, std::int64_t nb, const ConvGeometry& g, cudaStream_t stream);

// dst (C, nb * L) f32 = src (nb, C, L) transposed per image.
template <typename T>
cudaError_t launch_conv_to_channel_major(float* dst, const T* src, std::int64_t nb, std::int64_t C, std::int64_t L,
                                         cudaStream_t stream);
// dst (nb, C, L) = src (C, nb * L) + bias[c] (bias may be null), rounded once to T.
template <typename T>
cudaError_t launch_conv_from_channel_major(T* dst, const float* src, const T* bias, std::int64_t nb, std::int64_t C,
                                           std::int64_t L, cudaStream_t stream);

// out (B, C, L) += bias[c], in f32, rounded once to T.
template <typename T>
cudaError_t launch_conv_bias_add(T* out, const T* bias, std::int64_t B, std::int64_t C, std::int64_t L,
                                 cudaStream_t stream);
// dbias[c] = sum over b, l of dout (B, C, L), overwritten: one block per channel, f64 sums in a fixed order.
template <typename T>
cudaError_t launch_conv_bias_grad(T* dbias, const T* dout, std::int64_t B, std::int64_t C, std::int64_t L,
                                  cudaStream_t stream);

// dst[i] = f32(src[i]) / dst[i] = T(src[i]) (round to nearest even), i < n.
template <typename T>
cudaError_t launch_conv_widen(float* dst, const T* src, std::int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t launch_conv_narrow(T* dst, const float* src, std::int64_t n, cudaStream_t stream);

}  // namespace memtrain::cuda
