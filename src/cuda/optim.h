// Fused optimizer steps and block-wise 8-bit quantization on CUDA (and, at the end, Adafactor and the linear
// algebra of GaLore's projector): raw device pointers, f32 parameters, gradients and state, one kernel pass
// per step. Each step follows the update rule of its CPU class
// (optim::SGD, AdamW, Lion, AdamW8bit, Lion8bit) expression by expression, with the f32 scalars computed
// on the host exactly as the CPU class does, so results agree with it up to the CPU compiler's fused
// multiply-adds (AdamW: bit for bit). The hyper-parameters come as the group's double values plus the
// step count; the caller keeps the count (1-based: 1 on a parameter's first step).
//
// Non-finite gradients: like Optimizer::step, which skips a parameter whose gradient holds NaN or Inf
// with its state untouched, every step first checks the gradient on the device (skip_nonfinite, on by
// default) and then leaves the parameter and its state exactly as they were. The check is asynchronous
// and reports nothing; grad_is_finite() is the synchronous query for callers that count skips (then pass
// skip_nonfinite = false to the step to save the second read of the gradient).
//
// 8-bit state (see optim/quantized_state.h): codes u8 [n] and absmax f32 [ceil(n / block_size)], signed
// map for first moments, unsigned for second moments. The kernels keep one quantization block in
// registers (decode, update, new signed absmax, nearest-code encode), so the state never exists in f32 in
// global memory; quantize_blockwise gives the same codes and absmax as detail::quantize_block_reference,
// bit for bit. block_size: a power of two in [32, 4096] (quant_block_size_supported).
//
// Ordering and errors as in cuda.h: work goes to the device's current stream (stream.h) and a call returns
// before it finishes; argument errors throw "cuda::<name>: ..." before the device is touched. n == 0 is a
// no-op (hyper-parameters and block_size are still checked).
#pragma once

#include "memtrain/core/quant_map.h"

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// optim::SGD: d = g + wd p; with momentum mu > 0: buf = d on step 1, else mu buf + d; p -= lr (Nesterov:
// d + mu buf, else buf). Without momentum, p -= lr d and no buffer is used.
struct SgdHyper {
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.0;  // the group's beta1
  bool nesterov = false;  // needs momentum > 0
  std::int64_t step = 1;  // >= 1; step 1 initialises the momentum buffer (its old contents are not read)
  bool skip_nonfinite = true;
};

// optim::AdamW and optim::AdamW8bit: decoupled weight decay, bias correction with `step`, eps after the
// square root. betas in [0, 1), eps >= 0.
struct AdamWHyper {
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::int64_t step = 1;  // >= 1
  bool skip_nonfinite = true;
};

// optim::Lion and optim::Lion8bit: p = p (1 - lr wd) - lr sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g.
// betas in [0, 1].
struct LionHyper {
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.99;
  bool skip_nonfinite = true;
};

// param, grad: [n]. momentum: [n], may be null when hyper.momentum == 0.
void sgd_step(float* param, const float* grad, float* momentum, std::size_t n, const SgdHyper& hyper, int device);
// m ("exp_avg"), v ("exp_avg_sq"): [n], zeros before the first step. The rule of optim::AdamW.
void adamw_step(float* param, const float* grad, float* m, float* v, std::size_t n, const AdamWHyper& hyper,
                int device);
// m ("exp_avg"): [n], zeros before the first step.
void lion_step(float* param, const float* grad, float* m, std::size_t n, const LionHyper& hyper, int device);

// The rule of optim::AdamW8bit on 8-bit moments: m (signed map) and v (unsigned map), each codes [n] and
// absmax [ceil(n / block_size)]. A fresh state is every code quantize_blockwise gives for 0 and absmax 0.
void adamw8bit_step(float* param, const float* grad, std::uint8_t* m_codes, float* m_absmax, std::uint8_t* v_codes,
                    float* v_absmax, std::size_t n, std::int64_t block_size, const AdamWHyper& hyper, int device);
// The rule of optim::Lion8bit on one 8-bit moment (signed map).
void lion8bit_step(float* param, const float* grad, std::uint8_t* m_codes, float* m_absmax, std::size_t n,
                   std::int64_t block_size, const LionHyper& hyper, int device);

// src [n] -> codes [n] + absmax [ceil(n / block_size)]: per block the signed largest-magnitude value and the
// nearest code of x / absmax (ties to the lower code); the same bits as detail::quantize_block_reference.
void quantize_blockwise(const float* src, std::uint8_t* codes, float* absmax, std::size_t n,
                        std::int64_t block_size, QuantMap map, int device);
// dst[i] = map[codes[i]] * absmax[i / block_size], as detail::dequantize_block.
void dequantize_blockwise(const std::uint8_t* codes, const float* absmax, float* dst, std::size_t n,
                          std::int64_t block_size, QuantMap map, int device);

// True when no element of x [n] is NaN or Inf (true for n == 0). Waits for the device.
bool grad_is_finite(const float* x, std::size_t n, int device);

// ---- Adafactor (optim::Adafactor; src/cuda/cuda_adafactor.cpp, kernels/adafactor.cu) ----
// The rule of optim::Adafactor: factored second moment for rank >= 2 (R, C: running means of g^2 + eps1 along
// rows and columns, per batch item), unfactored for vectors, update clipping by RMS, lr as the step size,
// optional first moment, decoupled weight decay. Statistics and the update RMS are deterministic double sums
// (no atomics), so results agree with the CPU up to its compiler's fused multiply-adds (~1 ulp per step).
// The gradient must be finite (no non-finite gate here: the Optimizer base checks it before every update).
struct AdafactorHyper {
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;  // first-moment coefficient; read only when exp_avg is non-null. In [0, 1)
  double decay_rate = -0.8;  // beta2_t = 1 - step^decay_rate; < 0
  double eps1 = 1e-30;       // >= 0
  double clip_threshold = 1.0;  // > 0
  std::int64_t step = 1;        // >= 1
};
// Bytes of device scratch one step of n elements needs: factored with (batch, rows, cols) and
// batch * rows * cols == n; a vector with batch = rows = cols = 0.
std::size_t adafactor_workspace_bytes(std::size_t n, std::int64_t batch, std::int64_t rows, std::int64_t cols);
// param, grad, exp_avg: [batch, rows, cols]; row: [batch, rows]; col: [batch, cols]; exp_avg may be null (no
// first moment). workspace: adafactor_workspace_bytes(n, batch, rows, cols) bytes of device memory, 8-byte
// aligned, not read before it is written.
void adafactor_factored_step(float* param, const float* grad, float* row, float* col, float* exp_avg,
                             std::int64_t batch, std::int64_t rows, std::int64_t cols, const AdafactorHyper& hyper,
                             void* workspace, int device);
// param, grad, exp_avg_sq, exp_avg: [n]; exp_avg may be null. workspace: adafactor_workspace_bytes(n, 0, 0, 0).
void adafactor_vector_step(float* param, const float* grad, float* exp_avg_sq, float* exp_avg, std::size_t n,
                           const AdafactorHyper& hyper, void* workspace, int device);

// ---- Dense linear algebra for GaLore's projector (src/cuda/cuda_galore.cpp: cuSOLVER) ----
// Column-major f32 matrices on the device (a row-major [c, r] buffer is the column-major r x c matrix).
// Each call waits for the device (it reads cuSOLVER's info flag) and throws "cuda::<name>: ..." naming the
// failing cuSOLVER call, or the info value. Sizes must fit in 32 bits. Scratch comes from memtrain's allocator
// (MemoryCategory::workspace).

// a (rows x cols, leading dimension rows, rows >= cols >= 1) <- the thin Q of its Householder QR
// (geqrf + orgqr): orthonormal columns spanning a's range when a has full column rank.
void orthonormalize_columns(float* a, std::int64_t rows, std::int64_t cols, int device);
// Top-r singular vectors of a (rows x cols, leading dimension rows; not modified), singular values in
// descending order (gesvdj, Jacobi): u (rows x r, ld rows) and, when non-null, v (cols x r, ld cols).
// 1 <= r <= min(rows, cols). Signs are cuSOLVER's (each pair u_i, v_i is determined up to a joint sign).
void top_singular_vectors(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t r, float* u, float* v,
                          int device);
// dst (cols x rows, row-major) = the transpose of src (rows x cols, row-major). Not in place.
void transpose(const float* src, std::int64_t rows, std::int64_t cols, float* dst, int device);

// The block sizes the 8-bit kernels support: powers of two in [32, 4096].
constexpr bool quant_block_size_supported(std::int64_t block_size) {
  return block_size >= 32 && block_size <= 4096 && (block_size & (block_size - 1)) == 0;
}

}  // namespace memtrain::cuda
