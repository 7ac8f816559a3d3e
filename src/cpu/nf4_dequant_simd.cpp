// NF4 dequantisation, one span of 64-blocks per call, three ways: the scalar reference and AVX2 / AVX-512
// paths built with target attributes (whatever -march says), so every build carries all three and
// nf4_dequant.cpp picks one at run time. All three round the same f32 products, so they agree bit for bit.
//
// Vector layout: a byte holds elements 2j (high nibble) and 2j + 1 (low nibble). Bytes are widened to 32-bit
// lanes, split into high and low nibbles and interleaved back into element order; a nibble indexes the
// 16-entry level table by a register permute (AVX-512: one permutexvar; AVX2: two 8-entry permutes and a
// blend on bit 3), then one multiply by the block's absmax.
#include "cpu/nf4_kernels.h"

#include "core/nf4_table.h"
#include "memtrain/core/float_types.h"

#include <immintrin.h>

#include <cstring>

namespace memtrain::cpu::nf4 {

namespace {
using ::memtrain::detail::kNf4Levels;
constexpr std::int64_t kBytesPerBlock = 32;

// Round to nearest even on the bits, as BFloat16::from_float does for finite values (dequantised values
// are always finite).
[[gnu::target("avx2")]] inline __m256i bf16_bits8(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
}

[[gnu::target("avx2")]] inline __m256 lookup8(__m256 lo_tab, __m256 hi_tab, __m256i idx, __m256 absmax) {
  const __m256 lo = _mm256_permutevar8x32_ps(lo_tab, idx), hi = _mm256_permutevar8x32_ps(hi_tab, idx);
  // Bit 3 of the index moved to the sign bit picks the upper half of the table.
  return _mm256_mul_ps(_mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28))), absmax);
}
}  // namespace

void dequant_span_scalar(const Nf4View& v, std::int64_t first_block, std::int64_t blocks, void* out, bool bf16) {
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float a = block_absmax(v, first_block + b);
    const std::uint8_t* c = v.codes + (first_block + b) * kBytesPerBlock;
    float vals[64];
    for (int j = 0; j < kBytesPerBlock; ++j) {
      vals[2 * j] = kNf4Levels[c[j] >> 4] * a;
      vals[2 * j + 1] = kNf4Levels[c[j] & 15] * a;
    }
    if (bf16) {
      auto* dst = static_cast<std::uint16_t*>(out) + b * 64;
      for (int i = 0; i < 64; ++i) dst[i] = BFloat16::from_float(vals[i]).bits;
    } else {
      std::memcpy(static_cast<float*>(out) + b * 64, vals, sizeof(vals));
    }
  }
}

[[gnu::target("avx2")]] void dequant_span_avx2(const Nf4View& v, std::int64_t first_block, std::int64_t blocks,
                                               void* out, bool bf16) {
  const __m256 lo_tab = _mm256_loadu_ps(kNf4Levels.data()), hi_tab = _mm256_loadu_ps(kNf4Levels.data() + 8);
  const __m256i low_nibble = _mm256_set1_epi32(15);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const __m256 a = _mm256_set1_ps(block_absmax(v, first_block + b));
    const std::uint8_t* c = v.codes + (first_block + b) * kBytesPerBlock;
    for (int q = 0; q < 4; ++q) {  // 8 bytes -> 16 elements
      const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8 * q)));
      const __m256i hi = _mm256_srli_epi32(w, 4), lo = _mm256_and_si256(w, low_nibble);
      const __m256i u0 = _mm256_unpacklo_epi32(hi, lo), u1 = _mm256_unpackhi_epi32(hi, lo);
      const __m256 f0 = lookup8(lo_tab, hi_tab, _mm256_permute2x128_si256(u0, u1, 0x20), a);
      const __m256 f1 = lookup8(lo_tab, hi_tab, _mm256_permute2x128_si256(u0, u1, 0x31), a);
      const std::int64_t at = b * 64 + 16 * q;
      if (bf16) {
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits8(f0), bf16_bits8(f1)), 0xd8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(out) + at), packed);
      } else {
        _mm256_storeu_ps(static_cast<float*>(out) + at, f0);
        _mm256_storeu_ps(static_cast<float*>(out) + at + 8, f1);
      }
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
// GCC reports the deliberately undefined registers inside its own AVX-512 intrinsics as maybe-uninitialized
// (see cpu/quantized_kernels.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
[[gnu::target("avx512f,avx512bw")]] void dequant_span_avx512(const Nf4View& v, std::int64_t first_block,
                                                            std::int64_t blocks, void* out, bool bf16) {
  const __m512 tab = _mm512_loadu_ps(kNf4Levels.data());
  const __m512i low_nibble = _mm512_set1_epi32(15);
  // Element order from (hi = the 16 high nibbles, lo = the 16 low ones): hi0 lo0 hi1 lo1 ...
  const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i odd = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const __m512 a = _mm512_set1_ps(block_absmax(v, first_block + b));
    const std::uint8_t* c = v.codes + (first_block + b) * kBytesPerBlock;
    for (int q = 0; q < 2; ++q) {  // 16 bytes -> 32 elements
      const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16 * q)));
      const __m512i hi = _mm512_srli_epi32(w, 4), lo = _mm512_and_si512(w, low_nibble);
      const __m512 f[2] = {_mm512_mul_ps(_mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, even, lo), tab), a),
                           _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, odd, lo), tab), a)};
      for (int h = 0; h < 2; ++h) {
        const std::int64_t at = b * 64 + 32 * q + 16 * h;
        if (bf16) {
          const __m512i x = _mm512_castps_si512(f[h]);
          const __m512i rnd = _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                               _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1)));
          const __m256i bits = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(x, rnd), 16));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(out) + at), bits);
        } else {
          _mm512_storeu_ps(static_cast<float*>(out) + at, f[h]);
        }
      }
    }
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace memtrain::cpu::nf4
