// The code book of one block-wise 8-bit map (optim/quantized_state.h) as a backend's kernels read it: the
// 256 sorted map values and the bucket encoder table. Here, below the optimizer layer, so that a backend
// (the CUDA host code uploads these to the device) needs nothing from optim/: the optimizer layer builds
// and checks the maps once and defines quant_codebook() (src/optim/quantized_state.cpp).
#pragma once

#include "memtrain/core/quant_map.h"

#include <cstdint>

namespace memtrain::detail {

// Magnitudes are clamped to [2^-24, largest float below 1] before the bucket lookup (every encoder, CPU or
// device, clamps alike).
inline constexpr std::uint32_t kQuantEncodeLoBits = 103u << 23;  // 2^-24
inline constexpr std::uint32_t kQuantEncodeHiBits = 0x3f7fffffu;

// Which of the two maps (memtrain/core/quant_map.h).
using QuantCodebookKind = ::memtrain::QuantMap;

struct QuantCodebook {
  const float* values = nullptr;          // 256 map values, ascending
  const std::uint32_t* table = nullptr;   // `buckets` positive buckets, then `buckets` negative ones
  int low_bits = 0;                       // mantissa bits below the bucket index
  std::uint32_t buckets = 0;
  std::uint8_t zero_code = 0;             // nearest code of 0
};

// The code book of one map; lives as long as the program.
const QuantCodebook& quant_codebook(QuantCodebookKind kind);

}  // namespace memtrain::detail
