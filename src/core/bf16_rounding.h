// Rounding an f32 value to bf16 bits for parameters stored without an f32 master (optim::NarrowParams): to
// nearest, or stochastically with bits that are a pure function of (seed, stream, element), so the CPU and a
// GPU, at any thread count, before and after a resume, round every element the same way.
// Header-only, host and device (the CPU and CUDA backends' round_into_bf16 share it).
#pragma once

#include "memtrain/core/philox.h"

#include <bit>
#include <cstdint>

namespace memtrain::detail {

MEMTRAIN_HD inline std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<std::uint32_t>(x);
#endif
}

MEMTRAIN_HD inline bool bits_not_finite(std::uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u; }

// Round to nearest, ties to even; NaN stays a quiet NaN, Inf stays Inf (as BFloat16::from_float).
MEMTRAIN_HD inline std::uint16_t bf16_bits_nearest(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x7fc0u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Stochastic rounding: adding 16 uniform bits below the kept ones and truncating rounds the magnitude up with
// probability (dropped bits) / 2^16, its distance to the lower neighbour over the gap, so E[result] = x exactly
// (sign and magnitude: the same holds for negative x). Non-finite values round to nearest.
MEMTRAIN_HD inline std::uint16_t bf16_bits_stochastic(float x, std::uint32_t random16) {
  const std::uint32_t u = float_bits(x);
  if (bits_not_finite(u)) return bf16_bits_nearest(x);
  return static_cast<std::uint16_t>((u + random16) >> 16);
}

// The 16 random bits of element i of stream `stream` under `seed`: Philox4x32-10 block i / 8 (8 draws of 16
// bits per block), counter high word = stream. The kernels draw one block per 8 elements as this does (tests
// hold them to it).
MEMTRAIN_HD inline std::uint32_t bf16_rounding_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  const Philox4x32 block = philox4x32_10(i / 8, stream, seed);
  const std::uint32_t word = block.v[(i % 8) / 2];
  return (i & 1u) != 0 ? word >> 16 : word & 0xffffu;
}

MEMTRAIN_HD inline float bf16_bits_to_float(std::uint16_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
#else
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
#endif
}

}  // namespace memtrain::detail
