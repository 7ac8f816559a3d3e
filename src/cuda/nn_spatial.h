// Pooling and batch norm on CUDA over NCHW device buffers, forward and backward, as raw-pointer entry
// points (the semantics of cpu/pool.h and nn::BatchNorm2d). Conventions are those of memtrain/cuda/cuda.h:
// the device's current stream (stream.h) in call order, errors throw memtrain::Error("cuda::<name>: ..."), argument errors
// throw before the device is touched. dtype is the dtype of every data array: f32, bf16 or f16 (widened to
// f32 for arithmetic, rounded once on output). Batch statistics are f32. No atomics: deterministic.
#pragma once

#include "memtrain/core/dtype.h"

#include <cstdint>

namespace memtrain::cuda {

// ---- pooling over (planes = B * C, H, W), square windows ----

// OH = (H + 2 * padding - kernel) / stride + 1 (likewise OW; computed by the caller, >= 1); kernel,
// stride >= 1, 0 <= padding <= kernel / 2.
struct Pool2dShape {
  std::int64_t planes, H, W, kernel, stride, padding, OH, OW;
};

// out (planes, OH, OW): the first maximum of each window (NaN wins), -inf when it is all padding.
void max_pool2d_forward(void* out, const void* x, DType dtype, const Pool2dShape& s, int device);
// dx (planes, H, W) overwritten: dout routed to each window's (recomputed) first maximum.
void max_pool2d_backward(void* dx, const void* dout, const void* x, DType dtype, const Pool2dShape& s, int device);
// out = window sum / kernel^2 (padding counts as 0 and is counted: count_include_pad).
void avg_pool2d_forward(void* out, const void* x, DType dtype, const Pool2dShape& s, int device);
void avg_pool2d_backward(void* dx, const void* dout, DType dtype, const Pool2dShape& s, int device);

// ---- batch norm over x (B, C, HW) per channel ----

// y = (x - mean) * invstd * weight + bias (weight, bias (C) may be null). training: mean and the biased
// var of this batch (f64 sums), save_mean / save_invstd (C, f32) = mean, 1 / sqrt(var + eps); when
// running_mean / running_var (C, dtype) are non-null (both or neither) they become (1 - momentum) * running
// + momentum * stat, the var taking the unbiased var (n / (n - 1), n = B * HW >= 2). Eval: the running
// statistics (required) are used and written to save_mean / save_invstd (1 / sqrt(running_var + eps)).
void batch_norm_forward(void* y, float* save_mean, float* save_invstd, void* running_mean, void* running_var,
                        const void* x, const void* weight, const void* bias, DType dtype, std::int64_t B,
                        std::int64_t C, std::int64_t HW, bool training, double momentum, double eps, int device);
// With the forward's save_mean / save_invstd: dx (overwritten), dweight = sum dout * x_hat, dbias = sum dout
// (overwritten, skipped when null). training: dx includes the paths through the batch statistics.
void batch_norm_backward(void* dx, void* dweight, void* dbias, const void* dout, const void* x, const void* weight,
                         const float* save_mean, const float* save_invstd, DType dtype, std::int64_t B,
                         std::int64_t C, std::int64_t HW, bool training, int device);

}  // namespace memtrain::cuda
