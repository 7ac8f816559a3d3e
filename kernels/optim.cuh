// Launchers for the optimizer kernels in optim.cu: fused SGD / AdamW / Lion steps on f32 state, the
// 8-bit block-wise AdamW8bit / Lion8bit steps, block-wise quantize / dequantize, and the non-finite gate.
// Plain C++-callable. Every launcher takes raw device pointers, sizes and a stream, enqueues its kernel
// (nothing when n == 0) and returns the first error (cudaGetLastError() after the launch). The step
// coefficients are f32 values the host computed (see src/cuda/cuda_optim.cpp); `skip` is a device int
// from launch_nonfinite_flag: when it is non-zero the step kernel changes nothing. Maps are 256 host
// floats, sent with the launch as a kernel parameter.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

struct SgdCoeffs {
  float lr, weight_decay, momentum;
  bool use_momentum, nesterov, first;
};
// optim::AdamW (fp32 state): two fused multiply-adds, a division by sqrt(1 - b2^t).
struct AdamWCoeffs {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;          // 1 - lr wd
  float neg_step_size;  // -lr / (1 - b1^t)
  float bc2_sqrt;       // sqrt(1 - b2^t)
  float eps;
};
// optim::AdamW8bit: no fused multiply-adds, a multiplication by 1 / sqrt(1 - b2^t).
struct AdamW8bitCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float decay;         // 1 - lr wd
  float step_size;     // lr / (1 - b1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - b2^t)
  float eps;
};
struct LionCoeffs {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, decay, lr;
};

// Sets *flag (a device int) to 0, then to 1 when some x[i], i < n, is NaN or Inf.
cudaError_t launch_nonfinite_flag(const float* x, std::size_t n, int* flag, cudaStream_t stream);

// momentum may be null when !c.use_momentum. skip may be null (never skip).
cudaError_t launch_sgd_step(float* p, const float* g, float* momentum, std::size_t n, const SgdCoeffs& c,
                            const int* skip, cudaStream_t stream);
cudaError_t launch_adamw_step(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWCoeffs& c,
                              const int* skip, cudaStream_t stream);
cudaError_t launch_lion_step(float* p, const float* g, float* m, std::size_t n, const LionCoeffs& c,
                             const int* skip, cudaStream_t stream);

// block_size: a power of two in [32, 4096] (anything else returns cudaErrorInvalidValue). m_map / v_map:
// 256 host floats, sorted ascending.
cudaError_t launch_adamw8bit_step(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax,
                                  const float* m_map, std::uint8_t* v_codes, float* v_absmax, const float* v_map,
                                  std::size_t n, int block_size, const AdamW8bitCoeffs& c, const int* skip,
                                  cudaStream_t stream);
cudaError_t launch_lion8bit_step(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax, const float* map,
                                 std::size_t n, int block_size, const LionCoeffs& c, const int* skip,
                                 cudaStream_t stream);

cudaError_t launch_quantize_blockwise(const float* src, std::uint8_t* codes, float* absmax, const float* map,
                                      std::size_t n, int block_size, cudaStream_t stream);
cudaError_t launch_dequantize_blockwise(const std::uint8_t* codes, const float* absmax, float* dst,
                                        const float* map, std::size_t n, int block_size, cudaStream_t stream);

}  // namespace memtrain::cuda
