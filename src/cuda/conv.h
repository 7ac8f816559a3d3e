// conv2d on CUDA (NCHW, stride, padding, groups; the semantics of cpu/conv.h), forward and backward, as
// raw-pointer entry points on contiguous device buffers. Conventions are those of memtrain/cuda/cuda.h:
// work goes to the device's current stream (stream.h) in call order, errors throw
// memtrain::Error("cuda::<name>: ..."), argument errors throw before the device is touched.
//
// Two implementations:
//  - cuDNN (builds that found it: conv_cudnn_built()), legacy v9 API with deterministic algorithms; f32
//    runs with FMA math (no TF32), bf16 with f32 accumulation.
//  - im2col: column buffer kernels + cuda::gemm (cuBLAS) in f32, col2im by gather for dx; every CUDA build
//    has it.
// ConvImpl::automatic takes cuDNN when built, unless the environment sets MEMTRAIN_CONV_IM2COL=1.
// dtype is the dtype of every data array (x, weight, bias, out, dout, dx, dweight, dbias): f32, bf16 or
// f16 (widened to f32 for arithmetic). Scratch (column buffers, cuDNN workspace) comes from
// Allocator::get(Device::cuda(device)) under MemoryCategory::workspace. Results are deterministic.
#pragma once

#include "memtrain/core/dtype.h"

#include <cstdint>

namespace memtrain::cuda {

// Shapes of one conv2d: x (B, Cin, H, W), weight (Cout, Cin / groups, KH, KW), out (B, Cout, OH, OW),
// OH = (H + 2 * padding - KH) / stride + 1 (likewise OW; the caller computes them, >= 1).
struct Conv2dShape {
  std::int64_t B, Cin, H, W;
  std::int64_t Cout, KH, KW;
  std::int64_t stride, padding, groups;
  std::int64_t OH, OW;
};

enum class ConvImpl { automatic, cudnn, im2col };

bool conv_cudnn_built();  // true when this build links cuDNN (MEMTRAIN_HAVE_CUDNN)

// out = conv(x, weight) + bias; bias (Cout) may be null. ConvImpl::cudnn in a build without it throws.
void conv2d_forward(void* out, const void* x, const void* weight, const void* bias, DType dtype,
                    const Conv2dShape& s, int device, ConvImpl impl = ConvImpl::automatic);
// dx (needs weight), dweight (needs x), dbias: each overwritten, skipped when null.
void conv2d_backward(void* dx, void* dweight, void* dbias, const void* dout, const void* x, const void* weight,
                     DType dtype, const Conv2dShape& s, int device, ConvImpl impl = ConvImpl::automatic);

}  // namespace memtrain::cuda
