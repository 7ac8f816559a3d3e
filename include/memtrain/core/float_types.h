// Narrow floating-point storage types: Half (IEEE binary16), BFloat16, Float8E4M3 and Float8E5M2 (OCP OFP8).
// Each holds its raw bits; arithmetic happens in float. All conversions are inline, branch-free (selects, not
// jumps) and constexpr, so the bulk loops in cpu/convert.cpp vectorize.
//
// Rounding: every conversion into a narrow type rounds to nearest, ties to even, in ONE step from the source
// value; from_double never goes through float (that would round twice).
//
// Overflow, Inf and NaN:
//   Half, BFloat16  finite values that round past the largest finite value become +-Inf (IEEE behaviour);
//                   +-Inf stays +-Inf; NaN stays a NaN of the same sign with the quiet bit set (0x7e00 /
//                   0x7fc0; bf16 from float also keeps the top payload bits).
//   Float8E4M3      bias 7, no Inf, NaN = S.1111.111, max 448, subnormals down to 2^-9. Finite values beyond
//                   448 SATURATE to +-448 (the OCP spec's "saturation mode", what FP8 training recipes use:
//                   an outlier clips instead of poisoning a tensor with NaN). +-Inf and NaN become NaN (sign
//                   kept), since the format has no Inf.
//   Float8E5M2      bias 15, IEEE-like (Inf = S.11111.00, NaN = S.11111.xx, xx != 0), max 57344. Finite values
//                   beyond 57344 SATURATE to +-57344; +-Inf stays +-Inf; NaN becomes the quiet NaN S.11111.10.
// Negative zero keeps its sign; values below half the smallest subnormal round to signed zero.
//
// Everything is integer bit manipulation, so the FPU's rounding mode and flush-to-zero flags do not matter.
#pragma once

#include "memtrain/core/float_formats.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace memtrain {

namespace detail {

template <typename Src>
struct IeeeTraits;
template <>
struct IeeeTraits<float> {
  using Bits = std::uint32_t;
  static constexpr int kMant = 23;
  static constexpr int kBias = 127;
};
template <>
struct IeeeTraits<double> {
  using Bits = std::uint64_t;
  static constexpr int kMant = 52;
  static constexpr int kBias = 1023;
};

// Rounds a finite, non-negative `a` to the magnitude code (exponent and mantissa fields, no sign) of a binary
// format with kMant mantissa bits and exponent bias kBias, to nearest even. Codes past the format's largest
// finite value come out larger than it (the caller saturates or maps them to Inf). For Inf/NaN input the
// result is meaningless and the caller discards it.
template <int kMant, int kBias, typename Src>
constexpr typename IeeeTraits<Src>::Bits round_to_code(Src a) {
  using T = IeeeTraits<Src>;
  using Bits = typename T::Bits;
  constexpr int kShift = T::kMant - kMant;
  constexpr Bits kRebias = Bits(T::kBias - kBias) << T::kMant;
  constexpr Bits kMinNormal = Bits(T::kBias + 1 - kBias) << T::kMant;  // 2^(1 - kBias)
  constexpr Bits kMantMask = (Bits(1) << T::kMant) - 1;
  const Bits bits = std::bit_cast<Bits>(a);
  // Normal range: rebias the exponent and round the dropped mantissa bits; a carry out of the mantissa
  // correctly bumps the exponent (and past the largest finite value lands on the Inf code).
  const Bits normal =
      (bits - kRebias + ((Bits(1) << (kShift - 1)) - 1) + ((bits >> kShift) & 1)) >> kShift;
  // Subnormal range: the code is the significand shifted right by kShift plus how far the exponent lies
  // below the target's minimum, rounded the same way. Integer-only, so no FPU mode matters and the compiler
  // can if-convert the loop (a float op here would count as "may trap" and block vectorization).
  const Bits biased_exp = bits >> T::kMant;
  const Bits significand = (bits & kMantMask) | (biased_exp != 0 ? Bits(1) << T::kMant : Bits(0));
  const Bits exp_eff = biased_exp != 0 ? biased_exp : Bits(1);  // source subnormals share exponent 1
  // Only used when bits < kMinNormal, i.e. exp_eff <= the target's min-normal exponent; capped so the shift
  // stays below the word size (any shift >= kMant + 2 already rounds to zero).
  const Bits below = (kMinNormal >> T::kMant) - std::min(exp_eff, kMinNormal >> T::kMant);
  const Bits shift = std::min<Bits>(kShift + below, T::kMant + 2);
  const Bits subnormal =
      (significand + ((Bits(1) << (shift - 1)) - 1) + ((significand >> shift) & 1)) >> shift;
  return bits < kMinNormal ? subnormal : normal;
}

// Encodes `v` into the format described by Fmt (see the Format structs below), with sign.
template <typename Fmt, typename Src>
constexpr std::uint32_t encode(Src v) {
  using Bits = typename IeeeTraits<Src>::Bits;
  constexpr Bits kAbsMask = ~Bits(0) >> 1;
  constexpr Bits kInfBits = std::bit_cast<Bits>(std::numeric_limits<Src>::infinity());
  const Bits x = std::bit_cast<Bits>(v);
  const Bits a = x & kAbsMask;
  const std::uint32_t sign = std::uint32_t(x >> (sizeof(Bits) * 8 - 1)) << Fmt::kSignBit;
  const Bits code = round_to_code<Fmt::kMant, Fmt::kBias>(std::bit_cast<Src>(a));
  const std::uint32_t finite = code > Bits(Fmt::kMaxFinite) ? Fmt::kOverflow : std::uint32_t(code);
  const std::uint32_t special = a == kInfBits ? Fmt::kInf : Fmt::kNan;
  return sign | (a >= kInfBits ? special : finite);
}

// The value of type T (Half, BFloat16, Float8E4M3, Float8E5M2) nearest to v, in format Fmt.
template <typename T, typename Fmt, typename Src>
constexpr T encode_as(Src v) {
  return T::from_bits(static_cast<decltype(T::bits)>(encode<Fmt>(v)));
}

// The formats' parameters (core/float_formats.h, shared with the CUDA kernels).
using float_formats::BFloat16Format;
using float_formats::E4M3Format;
using float_formats::E5M2Format;
using float_formats::HalfFormat;

}  // namespace detail

struct Half {
  std::uint16_t bits;

  static constexpr Half from_bits(std::uint16_t b) { return Half{b}; }
  static constexpr Half from_float(float f) { return detail::encode_as<Half, detail::HalfFormat>(f); }
  static constexpr Half from_double(double d) { return detail::encode_as<Half, detail::HalfFormat>(d); }
  // Selects are written as masks where possible: GCC gives up on if-converting (so on vectorizing) a loop
  // whose selects nest into one many-way merge.
  constexpr float to_float() const {
    const std::uint32_t sign = std::uint32_t(bits & 0x8000u) << 16;
    const std::uint32_t em = bits & 0x7fffu;
    const std::uint32_t special_mask = 0u - std::uint32_t(em >= 0x7c00u);  // Inf/NaN: exponent 31 -> 255
    const std::uint32_t nan_mask = 0u - std::uint32_t(em > 0x7c00u);       // NaN: also set the quiet bit
    const std::uint32_t normal =
        ((em << 13) + (112u << 23) + (special_mask & (112u << 23))) | (nan_mask & 0x00400000u);
    // Subnormals: the mantissa field counts steps of 2^-24; int->float is exact here and the scaling is
    // done on the exponent bits.
    const std::uint32_t subnormal =
        std::bit_cast<std::uint32_t>(float(std::int32_t(em))) - (em != 0 ? (24u << 23) : 0u);
    return std::bit_cast<float>(sign | (em < 0x0400u ? subnormal : normal));
  }
};

struct BFloat16 {
  std::uint16_t bits;

  static constexpr BFloat16 from_bits(std::uint16_t b) { return BFloat16{b}; }
  // bf16 is the top half of a float, so rounding is one add on the bits (subnormals included); overflow
  // carries into the Inf pattern. Pure integer ops, so the bulk loop vectorizes.
  static constexpr BFloat16 from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const std::uint32_t nan = (x >> 16) | 0x7fc0u;
    return from_bits(static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded));
  }
  static constexpr BFloat16 from_double(double d) { return detail::encode_as<BFloat16, detail::BFloat16Format>(d); }
  constexpr float to_float() const { return std::bit_cast<float>(std::uint32_t(bits) << 16); }
};

struct Float8E4M3 {
  std::uint8_t bits;

  static constexpr Float8E4M3 from_bits(std::uint8_t b) { return Float8E4M3{b}; }
  static constexpr Float8E4M3 from_float(float f) { return detail::encode_as<Float8E4M3, detail::E4M3Format>(f); }
  static constexpr Float8E4M3 from_double(double d) { return detail::encode_as<Float8E4M3, detail::E4M3Format>(d); }
  constexpr float to_float() const {
    const std::uint32_t sign = std::uint32_t(bits & 0x80u) << 24;
    const std::uint32_t em = bits & 0x7fu;
    const std::uint32_t nan_mask = 0u - std::uint32_t(em == 0x7fu);  // S.1111.111 -> a quiet float NaN
    const std::uint32_t normal = ((em << 20) + (120u << 23)) | (nan_mask & 0x7fc00000u);  // rebias 7 -> 127
    const std::uint32_t subnormal =  // steps of 2^-9, scaled on the exponent bits as in Half
        std::bit_cast<std::uint32_t>(float(std::int32_t(em))) - (em != 0 ? (9u << 23) : 0u);
    return std::bit_cast<float>(sign | (em < 0x08u ? subnormal : normal));
  }
};

struct Float8E5M2 {
  std::uint8_t bits;

  static constexpr Float8E5M2 from_bits(std::uint8_t b) { return Float8E5M2{b}; }
  static constexpr Float8E5M2 from_float(float f) { return detail::encode_as<Float8E5M2, detail::E5M2Format>(f); }
  static constexpr Float8E5M2 from_double(double d) { return detail::encode_as<Float8E5M2, detail::E5M2Format>(d); }
  // E5M2 is binary16 with the low 8 mantissa bits dropped, so decoding is exact through Half.
  constexpr float to_float() const { return Half::from_bits(static_cast<std::uint16_t>(bits << 8)).to_float(); }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2 && sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1);
static_assert(std::is_trivially_copyable_v<Half> && std::is_trivially_copyable_v<BFloat16>);

}  // namespace memtrain
