// Launchers for the optimizer kernels in optim.cu: fused SGD / AdamW / Lion steps on f32 state, the
// 8-bit block-wise AdamW8bit / Lion8bit steps, block-wise quantize / dequantize, and the non-finite gate.
// Plain C++-callable. Every launcher takes raw device pointers, sizes and a stream, enqueues its kernel
// (nothing when n == 0) and returns the first error (cudaGetLastError() after the launch). The step
// coefficients are f32 values the host computed (see src/cuda/cuda_optim.cpp); `skip` is a device int
// from launch_nonfinite_flag: when it is non-zero the step kernel changes nothing. Maps are 256 host
// floats, sent with the launch as a kernel parameter; the encoders are device copies of the CPU's bucket
// tables (optim::detail::EncodeTable), staged into shared memory by each block.
//
// encode_code is __host__ __device__ so the CPU tests check it against detail::quantize_nearest without a
// GPU. Host code that wants only it defines MEMTRAIN_OPTIM_ENCODE_ONLY first (no CUDA header needed).
#pragma once

#if !defined(MEMTRAIN_OPTIM_ENCODE_ONLY)
#include <cuda_runtime_api.h>
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#if !defined(MT_HOST_DEVICE)
#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif
#endif

namespace memtrain::cuda {

// ---- nearest-code encoder (host and device) ----
namespace quant {

// As optim::detail::kEncodeLoBits / kEncodeHiBits: magnitudes are clamped to [2^-24, largest float below 1].
inline constexpr std::uint32_t kEncodeLoBits = 103u << 23;
inline constexpr std::uint32_t kEncodeHiBits = 0x3f7fffffu;

// optim::detail::encode_one (the bucket lookup: one load, one integer compare), split in two so a kernel
// can choose where the entry is loaded from, plus NaN -> code 0, which is what detail::quantize_nearest's
// binary search gives (no map value is <= NaN). A table holds `buckets` positive entries, then `buckets`
// negative ones. encode_code(x, ...) == quantize_nearest(x, map) for every float x.
struct Bucket {
  std::uint32_t index;  // into the table: negative x index the second half
  std::int32_t low;     // mantissa bits below the bucket, flipped for negative x
  bool nan;
};

MT_HOST_DEVICE inline Bucket bucket_of(float x, int low_bits, std::uint32_t buckets) {
  std::uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  std::memcpy(&u, &x, sizeof(u));
#endif
  const std::uint32_t abs_bits = u & 0x7fffffffu;
  const std::uint32_t mag =
      abs_bits < kEncodeLoBits ? kEncodeLoBits : (abs_bits > kEncodeHiBits ? kEncodeHiBits : abs_bits);
  const std::uint32_t neg = u >> 31;
  const std::uint32_t low_mask = (1u << low_bits) - 1u;
  return Bucket{(mag >> low_bits) - (kEncodeLoBits >> low_bits) + neg * buckets,
                static_cast<std::int32_t>((mag & low_mask) ^ (low_mask & (0u - neg))), abs_bits > 0x7f800000u};
}

// The code from the bucket's entry: its lower code (bits 0..7), plus one past its threshold (bits 8..31).
MT_HOST_DEVICE inline std::uint8_t code_in_bucket(const Bucket& b, std::uint32_t entry) {
  if (b.nan) return 0;
  return static_cast<std::uint8_t>(entry + (b.low > (static_cast<std::int32_t>(entry) >> 8) ? 1u : 0u));
}

MT_HOST_DEVICE inline std::uint8_t encode_code(float x, const std::uint32_t* table, int low_bits,
                                               std::uint32_t buckets) {
  const Bucket b = bucket_of(x, low_bits, buckets);
  return code_in_bucket(b, table[b.index]);
}

}  // namespace quant

#if !defined(MEMTRAIN_OPTIM_ENCODE_ONLY)

// One map's encoder on the device: `table` is a device array of 2 * buckets entries (the CPU's
// EncodeTable::table, copied); zero_code is the nearest code of 0. A kernel stages the first `staged`
// entries (<= 2 * buckets) into shared memory and reads the rest through __ldg: the unsigned map stages only
// its positive half (second moments are never negative), which keeps AdamW8bit at 26 KiB of shared memory
// per block, so 8 blocks of 256 threads fit on an SM.
struct EncodeTableArg {
  const std::uint32_t* table;
  int low_bits;
  std::uint32_t buckets;
  std::uint32_t staged;
  std::uint8_t zero_code;
};

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
// 256 host floats, sorted ascending; m_enc / v_enc: their encoders (device tables).
cudaError_t launch_adamw8bit_step(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax,
                                  const float* m_map, const EncodeTableArg& m_enc, std::uint8_t* v_codes,
                                  float* v_absmax, const float* v_map, const EncodeTableArg& v_enc, std::size_t n,
                                  int block_size, const AdamW8bitCoeffs& c, const int* skip, cudaStream_t stream);
cudaError_t launch_lion8bit_step(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax, const float* map,
                                 const EncodeTableArg& enc, std::size_t n, int block_size, const LionCoeffs& c,
                                 const int* skip, cudaStream_t stream);

cudaError_t launch_quantize_blockwise(const float* src, std::uint8_t* codes, float* absmax,
                                      const EncodeTableArg& enc, std::size_t n, int block_size,
                                      cudaStream_t stream);
cudaError_t launch_dequantize_blockwise(const std::uint8_t* codes, const float* absmax, float* dst,
                                        const float* map, std::size_t n, int block_size, cudaStream_t stream);

#endif  // !MEMTRAIN_OPTIM_ENCODE_ONLY

}  // namespace memtrain::cuda
