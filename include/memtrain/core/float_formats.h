// The narrow float formats as parameters of one rounding encoder: mantissa bits, exponent bias, sign
// position, and the magnitude codes of the largest finite value, of what a too-large finite value becomes,
// of +Inf and of the quiet NaN. One table for the CPU's encoder (core/float_types.h, detail::encode) and
// the CUDA kernels' (kernels/convert.cuh, cvt::encode), so both round to the same codes. Dependency-free
// C++17: nvcc-compiled kernels include it too.
#pragma once

#include <cstdint>

namespace memtrain::float_formats {

struct HalfFormat {
  static constexpr int kMant = 10, kBias = 15, kSignBit = 15;
  static constexpr std::uint32_t kMaxFinite = 0x7bff, kOverflow = 0x7c00, kInf = 0x7c00, kNan = 0x7e00;
};
struct BFloat16Format {
  static constexpr int kMant = 7, kBias = 127, kSignBit = 15;
  static constexpr std::uint32_t kMaxFinite = 0x7f7f, kOverflow = 0x7f80, kInf = 0x7f80, kNan = 0x7fc0;
};
struct E4M3Format {  // saturating, no Inf: Inf and NaN -> NaN
  static constexpr int kMant = 3, kBias = 7, kSignBit = 7;
  static constexpr std::uint32_t kMaxFinite = 0x7e, kOverflow = 0x7e, kInf = 0x7f, kNan = 0x7f;
};
struct E5M2Format {  // saturating, Inf stays Inf
  static constexpr int kMant = 2, kBias = 15, kSignBit = 7;
  static constexpr std::uint32_t kMaxFinite = 0x7b, kOverflow = 0x7b, kInf = 0x7c, kNan = 0x7e;
};

}  // namespace memtrain::float_formats
