// CUDA kernels of the neural-net ops, forward and backward, as raw-pointer entry points on contiguous
// row-major device buffers: softmax and log-softmax over the last dim, fused cross entropy, GELU (tanh),
// dropout and embedding. Each matches the CPU kernel of the same name in src/cpu/ (the reference its tests
// compare with). Conventions are those of memtrain/cuda/cuda.h: work goes to the device's current stream
// (stream.h) in call order, a launch returns before the kernel finishes, errors throw
// memtrain::Error("cuda::<name>: ..."); argument errors throw before the device is touched. (layer_norm and
// rms_norm have no raw entry: the backend's entries launch their kernels directly, src/cuda/norm.cu.)
//
// dtype is the dtype of every data array (x, out, dout, dx, dweight, logits, dlogits): f32, or bf16 / f16
// (widened to f32 for all arithmetic, rounded once to nearest even on output; f16 overflows to Inf, as on the
// CPU). Dropout takes the same three. Row statistics (lse), per-row losses and dloss are always f32. Index
// arrays (targets, indices) are i32 or i64 (index_dtype). The embedding backward takes its scratch from
// Allocator::get(Device::cuda(device)) (category workspace).
// Results are deterministic: no float atomics; a rerun on the same device gives the same bits.
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/core/rng.h"

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// ---- softmax over the last dim of (N, C) (cpu/softmax.h with inner == 1) ----

void softmax_forward(void* out, const void* x, DType dtype, std::int64_t N, std::int64_t C, int device);
// dx = out * (dout - sum_c dout * out); needs only the forward output.
void softmax_backward(void* dx, const void* dout, const void* out, DType dtype, std::int64_t N, std::int64_t C,
                      int device);
void log_softmax_forward(void* out, const void* x, DType dtype, std::int64_t N, std::int64_t C, int device);
// dx = dout - exp(out) * sum_c dout.
void log_softmax_backward(void* dx, const void* dout, const void* out, DType dtype, std::int64_t N, std::int64_t C,
                          int device);

// ---- fused log-softmax + negative log-likelihood over (N, V) logits ----

// losses (N, f32) = lse - logits[n, targets[n]], 0 where targets[n] == ignore_index; lse (N, f32) =
// log sum exp(logits[n]), written when non-null (the backward needs it). Targets are range-checked by the
// op front-end; here one outside [0, V) (and not ignore_index) gives a NaN loss, never a bad read.
void cross_entropy_forward(float* losses, float* lse, const void* logits, DType dtype, const void* targets,
                           DType index_dtype, std::int64_t N, std::int64_t V, std::int64_t ignore_index, int device);
// dlogits (N, V) = dloss[n * dloss_stride] * (softmax(logits[n]) - onehot(targets[n])), 0 rows where
// targets[n] == ignore_index (NaN rows for out-of-range targets). dloss_stride 0: one scale for all rows.
void cross_entropy_backward(void* dlogits, const float* dloss, std::int64_t dloss_stride, const void* logits,
                            const float* lse, DType dtype, const void* targets, DType index_dtype, std::int64_t N,
                            std::int64_t V, std::int64_t ignore_index, int device);

// ---- GELU, GPT-2's tanh approximation, over n elements ----

// y = gelu(x) (y may be x); dx = dy * gelu'(x) (dx may be dy).
void gelu_tanh_forward(void* y, const void* x, DType dtype, std::size_t n, int device);
void gelu_tanh_backward(void* dx, const void* dy, const void* x, DType dtype, std::size_t n, int device);

// ---- dropout over n elements (mask rule of cpu/dropout.h, bit for bit; draws cpu::dropout_rng_blocks(n)) ----

// out[i] = keep(i) ? x[i] / (1 - p) : 0, keep(i) iff Philox lane i % 4 of block state.offset + i / 4 under
// key state.seed is >= round(p * 2^32). p in [0, 1]. out may be x.
void dropout_forward(void* out, const void* x, DType dtype, std::size_t n, double p, RngState state, int device);
void dropout_backward(void* dx, const void* dout, DType dtype, std::size_t n, double p, RngState state, int device);

// ---- embedding: rows of a (V, C) table gathered by index ----

// out (N, C) = weight[indices[n]]. Indices are range-checked by the op front-end; a row whose index is
// outside [0, V) comes out NaN here.
void embedding_forward(void* out, const void* weight, const void* indices, DType dtype, DType index_dtype,
                       std::int64_t N, std::int64_t V, std::int64_t C, int device);
// dweight (V, C) += dout (N, C) rows scattered by index (accumulates, like cpu::embedding_backward).
// Repeated indices are summed in increasing n, in f32 starting from dweight (a segmented sum after a
// stable sort, no atomics): deterministic, and for f32 bit-identical to the CPU kernel. Out-of-range
// indices are skipped. N <= 2^31 - 1, V <= 2^31 - 1.
void embedding_backward(void* dweight, const void* dout, const void* indices, DType dtype, DType index_dtype,
                        std::int64_t N, std::int64_t V, std::int64_t C, int device);

}  // namespace memtrain::cuda
