// Fused optimizer steps and block-wise 8-bit quantization on CUDA: raw device pointers, f32 parameters,
// gradients and state, one kernel pass per step. Each step follows the update rule of its CPU class
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
// Ordering and errors as in cuda.h: work goes to the device's legacy default stream and a call returns
// before it finishes; argument errors throw "cuda::<name>: ..." before the device is touched. n == 0 is a
// no-op (hyper-parameters and block_size are still checked).
#pragma once

#include <cstddef>
#include <cstdint>

namespace memtrain::optim {
enum class QuantMap : std::uint8_t;  // optim/quantized_state.h: signed_dynamic, unsigned_dynamic
}  // namespace memtrain::optim

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
                        std::int64_t block_size, optim::QuantMap map, int device);
// dst[i] = map[codes[i]] * absmax[i / block_size], as detail::dequantize_block.
void dequantize_blockwise(const std::uint8_t* codes, const float* absmax, float* dst, std::size_t n,
                          std::int64_t block_size, optim::QuantMap map, int device);

// True when no element of x [n] is NaN or Inf (true for n == 0). Waits for the device.
bool grad_is_finite(const float* x, std::size_t n, int device);

// The block sizes the 8-bit kernels support: powers of two in [32, 4096].
constexpr bool quant_block_size_supported(std::int64_t block_size) {
  return block_size >= 32 && block_size <= 4096 && (block_size & (block_size - 1)) == 0;
}

}  // namespace memtrain::cuda
