// Internal building blocks of block-wise 8-bit state, shared by quantized_state.cpp and the fused 8-bit
// optimizer steps (adamw8bit.cpp, lion8bit.cpp). Not installed; the public API is quantized_state.h.
//
// Encoding (the nearest code of x / scale, ties to the lower code) uses the bucket table built in
// quantized_state.cpp: the float's sign, exponent and top mantissa bits pick a bucket that holds at most
// one decision midpoint; its 32-bit entry is the bucket's lower code (bits 0..7) and a threshold on the
// remaining low mantissa bits (bits 8..31), so one load and one integer compare give the code. With AVX2
// eight lanes share one gather. Decoding is map[code] * absmax; with AVX2 the eight map loads are scalar
// loads inserted into a vector, which on Zen 3 costs about half of one vpgatherdd.
#pragma once

#include "memtrain/optim/quantized_state.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#define MEMTRAIN_OPTIM_AVX2 1
#endif

namespace memtrain::optim::detail {

// Magnitudes are clamped to [2^-24, largest float below 1] before the bucket lookup: below 2^-24 every
// value encodes as the zero code (the smallest decision midpoint is above 1e-7), and at or above 1 the top
// bucket already gives the nearest code.
inline constexpr std::uint32_t kEncodeLoBits = 103u << 23;  // 2^-24
inline constexpr std::uint32_t kEncodeHiBits = 0x3f7fffffu;

// The encoder of one of the two dynamic maps; lives as long as the program.
struct EncodeTable {
  const float* map = nullptr;              // dynamic_map(kind).data()
  const std::uint32_t* table = nullptr;    // `buckets` positive buckets, then `buckets` negative ones
  int low_bits = 0;                        // mantissa bits below the bucket index
  std::uint32_t buckets = 0;
  std::uint8_t zero_code = 0;              // nearest code of 0
};
const EncodeTable& encode_table(QuantMap kind);
const EncodeTable& encode_table_for(const float* map);  // throws unless map is one of the two dynamic maps

// Nearest code of x (already divided by the scale). Branch-free: signs are random, so a branch on them
// would mispredict half the time. For negative x the low bits are flipped, so that larger still means
// nearer to the next code: code = base + (low > threshold), mod 256.
inline std::uint8_t encode_one(float x, const std::uint32_t* table, int low_bits, std::uint32_t buckets) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t mag = std::clamp(u & 0x7fffffffu, kEncodeLoBits, kEncodeHiBits);
  const std::uint32_t neg = u >> 31;
  const std::uint32_t idx = (mag >> low_bits) - (kEncodeLoBits >> low_bits) + neg * buckets;
  const std::uint32_t entry = table[idx];
  const std::uint32_t low_mask = (1u << low_bits) - 1;
  const auto low = static_cast<std::int32_t>((mag & low_mask) ^ (low_mask & (0u - neg)));
  return static_cast<std::uint8_t>(entry + (low > (static_cast<std::int32_t>(entry) >> 8) ? 1u : 0u));
}

// Codes of src[i] * (1 / scale), i < len; all the zero code when scale is 0. Portable loop.
inline void encode_span_scalar(const float* src, std::int64_t len, float scale, const EncodeTable& t,
                               std::uint8_t* codes) {
  if (scale == 0.0f) {
    std::memset(codes, t.zero_code, static_cast<std::size_t>(len));
    return;
  }
  const float inv = 1.0f / scale;
  // Locals: stores through the u8 codes may alias anything, so members would be reloaded every element.
  const std::uint32_t* table = t.table;
  const int low_bits = t.low_bits;
  const std::uint32_t buckets = t.buckets;
  for (std::int64_t i = 0; i < len; ++i) codes[i] = encode_one(src[i] * inv, table, low_bits, buckets);
}

#if defined(MEMTRAIN_OPTIM_AVX2)
// encode_one on 8 lanes, the table's constants held in registers across a block.
struct EncodeRegs {
  const int* table;
  __m128i shift;
  __m256i first, neg_offset, low_mask;
  explicit EncodeRegs(const EncodeTable& t)
      : table(reinterpret_cast<const int*>(t.table)), shift(_mm_cvtsi32_si128(t.low_bits)),
        first(_mm256_set1_epi32(static_cast<int>(kEncodeLoBits >> t.low_bits))),
        neg_offset(_mm256_set1_epi32(static_cast<int>(t.buckets))),
        low_mask(_mm256_set1_epi32(static_cast<int>((1u << t.low_bits) - 1))) {}
};

// The 8 codes of x (already divided by the scale), one per 32-bit lane; bits 8..31 of a lane are not zero.
inline __m256i encode8_lanes(const EncodeRegs& r, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i mag =
      _mm256_min_epu32(_mm256_max_epu32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                        _mm256_set1_epi32(static_cast<int>(kEncodeLoBits))),
                       _mm256_set1_epi32(static_cast<int>(kEncodeHiBits)));
  const __m256i sign = _mm256_srai_epi32(u, 31);
  const __m256i idx = _mm256_add_epi32(_mm256_sub_epi32(_mm256_srl_epi32(mag, r.shift), r.first),
                                       _mm256_and_si256(sign, r.neg_offset));
  const __m256i entry = _mm256_i32gather_epi32(r.table, idx, 4);
  const __m256i low = _mm256_xor_si256(_mm256_and_si256(mag, r.low_mask), _mm256_and_si256(sign, r.low_mask));
  const __m256i up = _mm256_cmpgt_epi32(low, _mm256_srai_epi32(entry, 8));  // -1 past the midpoint
  return _mm256_sub_epi32(entry, up);
}

// The 8 codes of x in the low 8 bytes: bytes 0, 4, 8, 12 of each 128-bit half, then the halves together.
inline __m128i encode8(const EncodeRegs& r, __m256 x) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(encode8_lanes(r, x), pick),
                                                     _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
  return _mm256_castsi256_si128(packed);
}

// 32 codes from four encode8_lanes results, in order: the low bytes, packed with unsigned saturation.
inline __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i byte = _mm256_set1_epi32(0xff);
  const __m256i ab = _mm256_packus_epi32(_mm256_and_si256(a, byte), _mm256_and_si256(b, byte));  // a0-3 b0-3 | a4-7 b4-7
  const __m256i cd = _mm256_packus_epi32(_mm256_and_si256(c, byte), _mm256_and_si256(d, byte));
  const __m256i abcd = _mm256_packus_epi16(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// map[codes[i]] for i < 8: eight scalar loads inserted into one vector.
inline __m256 decode8(const float* map, const std::uint8_t* codes) {
  std::uint64_t w;
  std::memcpy(&w, codes, sizeof(w));
  return _mm256_setr_ps(map[w & 255], map[(w >> 8) & 255], map[(w >> 16) & 255], map[(w >> 24) & 255],
                        map[(w >> 32) & 255], map[(w >> 40) & 255], map[(w >> 48) & 255], map[w >> 56]);
}

// encode_span_scalar, 32 and then 8 lanes at a time. The tail re-encodes the last 8 (overlapping)
// elements: same codes.
[[gnu::always_inline]] inline void encode_span_avx2(const float* src, std::int64_t len, float scale, const EncodeTable& t,
                             std::uint8_t* codes) {
  if (scale == 0.0f || len < 8) {
    encode_span_scalar(src, len, scale, t, codes);
    return;
  }
  const EncodeRegs r(t);
  const __m256 inv = _mm256_set1_ps(1.0f / scale);
  std::int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m256i a = encode8_lanes(r, _mm256_mul_ps(_mm256_loadu_ps(src + i), inv));
    const __m256i b = encode8_lanes(r, _mm256_mul_ps(_mm256_loadu_ps(src + i + 8), inv));
    const __m256i c = encode8_lanes(r, _mm256_mul_ps(_mm256_loadu_ps(src + i + 16), inv));
    const __m256i d = encode8_lanes(r, _mm256_mul_ps(_mm256_loadu_ps(src + i + 24), inv));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), pack32(a, b, c, d));
  }
  for (; i + 8 <= len; i += 8)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), encode8(r, _mm256_mul_ps(_mm256_loadu_ps(src + i), inv)));
  if (i < len) {
    const std::int64_t j = len - 8;
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + j), encode8(r, _mm256_mul_ps(_mm256_loadu_ps(src + j), inv)));
  }
}

// Largest and smallest lane.
inline float hmax8(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}
inline float hmin8(__m256 v) {
  __m128 a = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_min_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_min_ss(a, _mm_movehdup_ps(a)));
}
#endif

// The encoder of the build: AVX2 where compiled for it, else the portable loop. Same codes either way.
inline void encode_span(const float* src, std::int64_t len, float scale, const EncodeTable& t, std::uint8_t* codes) {
#if defined(MEMTRAIN_OPTIM_AVX2)
  encode_span_avx2(src, len, scale, t, codes);
#else
  encode_span_scalar(src, len, scale, t, codes);
#endif
}

// The absmax a block stores for its scale: an all-zero block stores +0 (the scale may be -0).
inline float stored_scale(float scale) { return scale == 0.0f ? 0.0f : scale; }

// A thread's fp32 scratch for `count` arrays of one block each, every array 64-byte aligned (a 32-byte access
// to 16-byte-aligned memory splits across cache lines every other time) and padded to whole 8-lane groups.
class BlockScratch {
 public:
  BlockScratch(std::int64_t block_size, int count)
      : stride_(static_cast<std::size_t>((block_size + 15) / 16 * 16)), buf_(stride_ * count + 16) {}
  float* array(int k) {
    const auto base = (reinterpret_cast<std::uintptr_t>(buf_.data()) + 63) & ~std::uintptr_t{63};
    return reinterpret_cast<float*>(base) + stride_ * static_cast<std::size_t>(k);
  }

 private:
  std::size_t stride_;
  std::vector<float> buf_;
};

// OpenMP threads start only above this many elements; below it a parallel region costs more than it saves.
inline constexpr std::int64_t kParallelMinElements = 32768;

}  // namespace memtrain::optim::detail
