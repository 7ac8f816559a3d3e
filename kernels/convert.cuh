// Launchers for the conversion, FP8-scaling and reduction kernels in convert.cu and reduce.cu, plus the
// bit-level conversion rules they use.
//
// The rules (namespace cvt) are __host__ __device__ and pure integer bit manipulation: they copy the CPU
// rules of core/float_types.h and cpu/convert.cpp line for line (round to nearest even in one step; f16 /
// bf16 overflow to Inf; fp8 saturates to its finite max, NaN stays NaN; f32 <-> f64 NaNs keep their
// payload and get the quiet bit, as x86 and Arm do), so a CUDA cast equals cpu::convert bit for bit,
// whatever the FPU's flush-to-zero or rounding flags. Being host code too, they are unit-tested on the CPU
// against cpu::convert (tests/test_cuda_convert.cpp), without a GPU. We do not use cuda_fp8.h's
// conversions: their NaN and overflow handling is not the CPU's.
//
// Launchers are plain C++-callable: raw device pointers, element counts, a stream; each enqueues its
// kernel(s) (nothing when there is no work) and returns cudaGetLastError(). Sizes are 64-bit throughout.
// Host code that wants only the rules defines MEMTRAIN_CONVERT_RULES_ONLY before including this file: it
// then needs no CUDA header (the tests are built without the CUDA include path, with or without CUDA).
#pragma once

#if !defined(MEMTRAIN_CONVERT_RULES_ONLY)
#include <cuda_runtime_api.h>
#endif

#include "memtrain/core/float_formats.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace memtrain::cuda {

// The floating-point storage formats the kernels read and write.
enum class FloatFormat : int { f64, f32, f16, bf16, e4m3, e5m2 };

// ---- conversion rules (host and device) ------------------------------------------------------------
namespace cvt {

MT_HOST_DEVICE inline std::uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}
MT_HOST_DEVICE inline float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

template <typename T>
MT_HOST_DEVICE constexpr T min_of(T a, T b) {
  return b < a ? b : a;
}

// Rounds the magnitude bits `a` (sign clear, finite) of a binary source format (kSrcMant mantissa bits,
// bias kSrcBias) to the magnitude code of a format with kMant mantissa bits and bias kBias, to nearest
// even. Codes past the target's largest finite value come out larger than it. Same as
// detail::round_to_code in core/float_types.h.
template <typename Bits, int kSrcMant, int kSrcBias, int kMant, int kBias>
MT_HOST_DEVICE constexpr Bits round_to_code(Bits a) {
  constexpr int kShift = kSrcMant - kMant;
  constexpr Bits kRebias = Bits(kSrcBias - kBias) << kSrcMant;
  constexpr Bits kMinNormal = Bits(kSrcBias + 1 - kBias) << kSrcMant;  // 2^(1 - kBias)
  constexpr Bits kMinNormalExp = kMinNormal >> kSrcMant;
  constexpr Bits kMantMask = (Bits(1) << kSrcMant) - 1;
  // Normal range: rebias and round the dropped bits; a carry out of the mantissa bumps the exponent.
  // (Unsigned wrap-around when a < kRebias is harmless: that result is not selected.)
  const Bits normal = (a - kRebias + ((Bits(1) << (kShift - 1)) - 1) + ((a >> kShift) & 1)) >> kShift;
  // Subnormal range: shift the significand right by kShift plus how far the exponent lies below the
  // target's minimum, rounding the same way; shifts >= kSrcMant + 2 round to zero, so cap there.
  const Bits biased_exp = a >> kSrcMant;
  const Bits significand = (a & kMantMask) | (biased_exp != 0 ? Bits(1) << kSrcMant : Bits(0));
  const Bits exp_eff = biased_exp != 0 ? biased_exp : Bits(1);
  const Bits below = kMinNormalExp - min_of(exp_eff, kMinNormalExp);
  const Bits shift = min_of<Bits>(Bits(kShift) + below, Bits(kSrcMant + 2));
  const Bits subnormal = (significand + ((Bits(1) << (shift - 1)) - 1) + ((significand >> shift) & 1)) >> shift;
  return a < kMinNormal ? subnormal : normal;
}

// Target formats (memtrain/core/float_formats.h, the CPU's table) and f32 as a target of f64.
using float_formats::BFloat16Format;
using float_formats::E4M3Format;
using float_formats::E5M2Format;
using float_formats::HalfFormat;
struct Float32Format {  // f64 -> f32 (NaN is handled before encode, to keep the payload)
  static constexpr int kMant = 23, kBias = 127, kSignBit = 31;
  static constexpr std::uint32_t kMaxFinite = 0x7f7fffff, kOverflow = 0x7f800000, kInf = 0x7f800000,
                                 kNan = 0x7fc00000;
};

// Encodes a float (as bits) into Fmt, with sign. detail::encode<Fmt>(float).
template <typename Fmt>
MT_HOST_DEVICE constexpr std::uint32_t encode_f32(std::uint32_t x) {
  const std::uint32_t a = x & 0x7fffffffu;
  const std::uint32_t sign = (x >> 31) << Fmt::kSignBit;
  const std::uint32_t code = round_to_code<std::uint32_t, 23, 127, Fmt::kMant, Fmt::kBias>(a);
  const std::uint32_t finite = code > Fmt::kMaxFinite ? Fmt::kOverflow : code;
  const std::uint32_t special = a == 0x7f800000u ? Fmt::kInf : Fmt::kNan;
  return sign | (a >= 0x7f800000u ? special : finite);
}

// Encodes a double (as bits) into Fmt, with sign: one rounding from the double, never through float.
template <typename Fmt>
MT_HOST_DEVICE constexpr std::uint32_t encode_f64(std::uint64_t x) {
  constexpr std::uint64_t kInf = 0x7ff0000000000000ull;
  const std::uint64_t a = x & 0x7fffffffffffffffull;
  const std::uint32_t sign = std::uint32_t(x >> 63) << Fmt::kSignBit;
  const std::uint64_t code = round_to_code<std::uint64_t, 52, 1023, Fmt::kMant, Fmt::kBias>(a);
  const std::uint32_t finite = code > std::uint64_t(Fmt::kMaxFinite) ? Fmt::kOverflow : std::uint32_t(code);
  const std::uint32_t special = a == kInf ? Fmt::kInf : Fmt::kNan;
  return sign | (a >= kInf ? special : finite);
}

// ---- narrow -> float (exact); each is the to_float of core/float_types.h ----

MT_HOST_DEVICE constexpr std::uint32_t half_to_f32(std::uint32_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  const std::uint32_t special_mask = 0u - std::uint32_t(em >= 0x7c00u);  // Inf/NaN: exponent 31 -> 255
  const std::uint32_t nan_mask = 0u - std::uint32_t(em > 0x7c00u);       // NaN: also set the quiet bit
  const std::uint32_t normal = ((em << 13) + (112u << 23) + (special_mask & (112u << 23))) | (nan_mask & 0x00400000u);
  // Subnormal: em * 2^-24, exact. Normalize by hand (integer only): em = 1.f * 2^p, p = top bit.
  std::uint32_t subnormal = 0;
  if (em != 0 && em < 0x0400u) {
    int p = 9;
    while (((em >> p) & 1u) == 0) --p;
    subnormal = (std::uint32_t(p - 24 + 127) << 23) | ((em << (23 - p)) & 0x7fffffu);
  }
  return sign | (em < 0x0400u ? subnormal : normal);
}

MT_HOST_DEVICE constexpr std::uint32_t bf16_to_f32(std::uint32_t b) { return b << 16; }

MT_HOST_DEVICE constexpr std::uint32_t e4m3_to_f32(std::uint32_t q) {
  const std::uint32_t sign = (q & 0x80u) << 24;
  const std::uint32_t em = q & 0x7fu;
  const std::uint32_t nan_mask = 0u - std::uint32_t(em == 0x7fu);  // S.1111.111 -> a quiet float NaN
  const std::uint32_t normal = ((em << 20) + (120u << 23)) | (nan_mask & 0x7fc00000u);  // rebias 7 -> 127
  std::uint32_t subnormal = 0;  // em * 2^-9, em in 1..7
  if (em != 0 && em < 0x08u) {
    const int p = em >= 4 ? 2 : (em >= 2 ? 1 : 0);
    subnormal = (std::uint32_t(p - 9 + 127) << 23) | ((em << (23 - p)) & 0x7fffffu);
  }
  return sign | (em < 0x08u ? subnormal : normal);
}

// E5M2 is binary16 with the low 8 mantissa bits dropped.
MT_HOST_DEVICE constexpr std::uint32_t e5m2_to_f32(std::uint32_t q) { return half_to_f32(q << 8); }

// ---- float -> narrow ----

MT_HOST_DEVICE constexpr std::uint32_t f32_to_half(std::uint32_t x) { return encode_f32<HalfFormat>(x); }
// BFloat16::from_float: one add on the bits; a NaN keeps its sign and top payload bits, quiet bit set.
MT_HOST_DEVICE constexpr std::uint32_t f32_to_bf16(std::uint32_t x) {
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x7fc0u;
  return (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}
MT_HOST_DEVICE constexpr std::uint32_t f32_to_e4m3(std::uint32_t x) { return encode_f32<E4M3Format>(x); }
MT_HOST_DEVICE constexpr std::uint32_t f32_to_e5m2(std::uint32_t x) { return encode_f32<E5M2Format>(x); }

// ---- f32 <-> f64, as a C++ cast on x86/Arm: exact widening; narrowing rounds to nearest even, overflows
// to Inf; a NaN keeps sign and (top) payload bits and gets the quiet bit ----

MT_HOST_DEVICE constexpr std::uint64_t f32_to_f64(std::uint32_t x) {
  const std::uint64_t sign = std::uint64_t(x >> 31) << 63;
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7ff8000000000000ull | (std::uint64_t(a & 0x7fffffu) << 29);
  if (a == 0x7f800000u) return sign | 0x7ff0000000000000ull;
  if (a >= 0x00800000u) return sign | ((std::uint64_t(a) << 29) + (std::uint64_t(1023 - 127) << 52));
  if (a == 0) return sign;
  int p = 22;  // subnormal: a * 2^-149 = 1.f * 2^(p - 149), p = top bit of a
  while (((a >> p) & 1u) == 0) --p;
  return sign | (std::uint64_t(p - 149 + 1023) << 52) | ((std::uint64_t(a) << (52 - p)) & 0xfffffffffffffull);
}

MT_HOST_DEVICE constexpr std::uint32_t f64_to_f32(std::uint64_t x) {
  const std::uint64_t a = x & 0x7fffffffffffffffull;
  if (a > 0x7ff0000000000000ull) {
    return (std::uint32_t(x >> 63) << 31) | 0x7fc00000u | std::uint32_t((a >> 29) & 0x7fffffu);
  }
  return encode_f64<Float32Format>(x);
}

// ---- any float format -> any float format, as cpu::convert: widen exactly (to float, or double for an
// f64 source), then round once ----

template <FloatFormat F>
struct Storage;
template <> struct Storage<FloatFormat::f64> { using type = std::uint64_t; };
template <> struct Storage<FloatFormat::f32> { using type = std::uint32_t; };
template <> struct Storage<FloatFormat::f16> { using type = std::uint16_t; };
template <> struct Storage<FloatFormat::bf16> { using type = std::uint16_t; };
template <> struct Storage<FloatFormat::e4m3> { using type = std::uint8_t; };
template <> struct Storage<FloatFormat::e5m2> { using type = std::uint8_t; };
template <FloatFormat F>
using StorageT = typename Storage<F>::type;

// The bits of the float an element widens to (not used for f64).
template <FloatFormat F>
MT_HOST_DEVICE constexpr std::uint32_t widen_to_f32(StorageT<F> v) {
  if constexpr (F == FloatFormat::f32) return v;
  else if constexpr (F == FloatFormat::f16) return half_to_f32(v);
  else if constexpr (F == FloatFormat::bf16) return bf16_to_f32(v);
  else if constexpr (F == FloatFormat::e4m3) return e4m3_to_f32(v);
  else return e5m2_to_f32(v);
}

template <FloatFormat To>
MT_HOST_DEVICE constexpr StorageT<To> narrow_from_f32(std::uint32_t x) {
  if constexpr (To == FloatFormat::f64) return f32_to_f64(x);
  else if constexpr (To == FloatFormat::f32) return x;
  else if constexpr (To == FloatFormat::f16) return static_cast<std::uint16_t>(f32_to_half(x));
  else if constexpr (To == FloatFormat::bf16) return static_cast<std::uint16_t>(f32_to_bf16(x));
  else if constexpr (To == FloatFormat::e4m3) return static_cast<std::uint8_t>(f32_to_e4m3(x));
  else return static_cast<std::uint8_t>(f32_to_e5m2(x));
}

template <FloatFormat To>
MT_HOST_DEVICE constexpr StorageT<To> narrow_from_f64(std::uint64_t x) {
  if constexpr (To == FloatFormat::f64) return x;
  else if constexpr (To == FloatFormat::f32) return f64_to_f32(x);
  else if constexpr (To == FloatFormat::f16) return static_cast<std::uint16_t>(encode_f64<HalfFormat>(x));
  else if constexpr (To == FloatFormat::bf16) return static_cast<std::uint16_t>(encode_f64<BFloat16Format>(x));
  else if constexpr (To == FloatFormat::e4m3) return static_cast<std::uint8_t>(encode_f64<E4M3Format>(x));
  else return static_cast<std::uint8_t>(encode_f64<E5M2Format>(x));
}

template <FloatFormat From, FloatFormat To>
MT_HOST_DEVICE constexpr StorageT<To> convert(StorageT<From> v) {
  if constexpr (From == To) return v;  // a copy, as cpu::convert (NaN payloads included)
  else if constexpr (From == FloatFormat::f64) return narrow_from_f64<To>(v);
  else return narrow_from_f32<To>(widen_to_f32<From>(v));
}

// ---- scaled FP8 ----

// Largest finite value of the FP8 format: 448 (e4m3) or 57344 (e5m2).
MT_HOST_DEVICE constexpr float fp8_max(bool e4m3) { return e4m3 ? 448.0f : 57344.0f; }

// x * scale in f32 (one IEEE rounding, never contracted into an FMA), then to FP8 like a cast.
MT_HOST_DEVICE inline std::uint8_t quantize_one(float x, float scale, bool e4m3) {
#if defined(__CUDA_ARCH__)
  const float y = __fmul_rn(x, scale);
#else
  const float y = x * scale;
#endif
  return static_cast<std::uint8_t>(e4m3 ? f32_to_e4m3(bits_of(y)) : f32_to_e5m2(bits_of(y)));
}

// The scale of one block from its amax (DeepSeek-V3): scale = fp8_max / amax and inv_scale =
// amax / fp8_max, each one IEEE f32 division. When amax is 0, Inf or NaN, or fp8_max / amax overflows,
// both are 1 (an all-zero block stays zero; Inf/NaN go through unscaled and become NaN/Inf by the cast).
MT_HOST_DEVICE inline void block_scale(float amax, bool e4m3, float* scale, float* inv_scale) {
  constexpr float kFloatMax = 3.40282346638528859811704183484516925e+38f;
  const float m = fp8_max(e4m3);
  if (amax > 0.0f && amax <= kFloatMax) {
#if defined(__CUDA_ARCH__)
    const float s = __fdiv_rn(m, amax);
    const float inv = __fdiv_rn(amax, m);
#else
    const float s = m / amax;
    const float inv = amax / m;
#endif
    if (s <= kFloatMax) {
      *scale = s;
      *inv_scale = inv;
      return;
    }
  }
  *scale = 1.0f;
  *inv_scale = 1.0f;
}

}  // namespace cvt

#if !defined(MEMTRAIN_CONVERT_RULES_ONLY)
// ---- launchers (convert.cu) ----

// dst[i] = src[i] converted by the rules above, i < n. src == dst is allowed when both formats have the
// same element size; other overlaps are not. Same format: a device-to-device copy.
cudaError_t launch_cast(const void* src, FloatFormat src_format, void* dst, FloatFormat dst_format, std::size_t n,
                        cudaStream_t stream);

// Per-tensor scaled FP8. src: f32 or bf16; dst: e4m3 or e5m2 codes. The scale is *scale_ptr when
// scale_ptr is not null (read on the device), else `scale`. dst[i] = quantize_one(src[i], scale).
// amax: when not null, receives max |src[i]| (0 for n == 0; NaN when any element is NaN).
cudaError_t launch_quantize_fp8(const void* src, FloatFormat src_format, float scale, const float* scale_ptr,
                                std::uint8_t* dst, bool e4m3, std::size_t n, float* amax, cudaStream_t stream);
// dst[i] = fp8(src[i]) * inv_scale in f32, then rounded to dst_format (f32 or bf16).
cudaError_t launch_dequantize_fp8(const std::uint8_t* src, bool e4m3, float inv_scale, const float* inv_scale_ptr,
                                  void* dst, FloatFormat dst_format, std::size_t n, cudaStream_t stream);

// Blockwise FP8 on a row-major (rows, cols) matrix, tiles of tile_rows x 128 (tile_rows 1 or 128).
// inv_scales is (ceil(rows / tile_rows), ceil(cols / 128)), row-major; each tile uses block_scale().
cudaError_t launch_quantize_fp8_blockwise(const void* src, FloatFormat src_format, std::uint8_t* dst, bool e4m3,
                                          float* inv_scales, std::int64_t rows, std::int64_t cols, int tile_rows,
                                          cudaStream_t stream);
cudaError_t launch_dequantize_fp8_blockwise(const std::uint8_t* src, bool e4m3, const float* inv_scales, void* dst,
                                            FloatFormat dst_format, std::int64_t rows, std::int64_t cols,
                                            int tile_rows, cudaStream_t stream);

// ---- launchers (reduce.cu); src formats f32, f16 or bf16 ----

// *out = max |src[i]| (0 for n == 0; NaN when any element is NaN, Inf when any is Inf and none NaN).
cudaError_t launch_amax(const void* src, FloatFormat src_format, std::size_t n, float* out, cudaStream_t stream);

// Partial sums per block for launch_sum: it needs this many doubles of device scratch.
constexpr std::size_t kSumMaxBlocks = 1024;
// *out = sum of src[0, n), accumulated in f64 in a fixed order (fixed grid for a given n, fixed trees),
// rounded once to f32: identical bits on every run. `partials` is kSumMaxBlocks doubles of scratch that no
// other work may use until this sum is done (the two kernels run back to back on `stream`).
cudaError_t launch_sum(const void* src, FloatFormat src_format, std::size_t n, double* partials, float* out,
                       cudaStream_t stream);
// out[r] = sum of src[r * cols, (r + 1) * cols) for r < rows; f64 accumulation, fixed order, f32 result.
cudaError_t launch_sum_rows(const void* src, FloatFormat src_format, std::int64_t rows, std::int64_t cols, float* out,
                            cudaStream_t stream);
#endif  // !MEMTRAIN_CONVERT_RULES_ONLY

}  // namespace memtrain::cuda

#undef MT_HOST_DEVICE
