// The CPU kernels of block-wise 8-bit state, shared by optim/quantized_state.cpp (which builds the tables) and
// the CPU backend's fused 8-bit optimizer steps (optim_8bit.cpp). Not installed; the public API is
// memtrain/optim/quantized_state.h. (The namespace stays optim::detail, the state's.)
//
// With AVX-512 (F, BW, DQ, VBMI, VBMI2) neither direction loads from memory per value. Encoding is
// arithmetic (arith_encode_one below, 16 lanes a time): within a decade the dynamic map is a linear grid,
// so one fused multiply-add gives the code, and the few lanes that land too near a decision go to a
// binary search over the map's exact decision thresholds held in registers (tree_encode_one). Decoding
// looks up each of the four bytes of map[code] in a 256-byte plane with byte permutes, 64 codes a time.
// Without AVX-512 the table encoder and scalar-load decoder below are used.
//
// Encoding (the nearest code of x / scale, ties to the lower code) uses the bucket table built in
// quantized_state.cpp: the float's sign, exponent and top mantissa bits pick a bucket that holds at most
// one decision midpoint; its 32-bit entry is the bucket's lower code (bits 0..7) and a threshold on the
// remaining low mantissa bits (bits 8..31), so one load and one integer compare give the code. With AVX2
// eight lanes share one gather. Decoding is map[code] * absmax; with AVX2 the eight map loads are scalar
// loads inserted into a vector, which on Zen 3 costs about half of one vpgatherdd.
#pragma once

#include "core/quant_codebook.h"
#include "memtrain/core/quant_map.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#define MEMTRAIN_OPTIM_AVX2 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VBMI__) && \
    defined(__AVX512VBMI2__)
#define MEMTRAIN_OPTIM_AVX512 1
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports the deliberately undefined registers inside its own AVX-512 intrinsics (_mm512_undefined_*
// behind set1, max, shifts, permutes, maskz loads and the reductions) as "(may be) used uninitialized"
// wherever they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

namespace memtrain::optim::detail {

using ::memtrain::detail::block_scale;

// Magnitudes are clamped to [2^-24, largest float below 1] before the bucket lookup: below 2^-24 every
// value encodes as the zero code (the smallest decision midpoint is above 1e-7), and at or above 1 the top
// bucket already gives the nearest code.
inline constexpr std::uint32_t kEncodeLoBits = ::memtrain::detail::kQuantEncodeLoBits;  // 2^-24
inline constexpr std::uint32_t kEncodeHiBits = ::memtrain::detail::kQuantEncodeHiBits;

// The arithmetic encoder's tables, built and checked in quantized_state.cpp (see arith_encode_one).
// Regions: 0 is the zero code's, 1..7 the decades 10^-6 .. 10^0, 8 the code of 1.0 (x > 0); for x < 0 the
// signed map uses regions 16..24, mirrored.
struct ArithTable {
  static constexpr float kFloor = 0x1p-25f;  // magnitudes are raised to this (still the zero code)
  std::int32_t region_below[32];   // by binary exponent mod 32: the region of the binade's lowest value
  std::int32_t boundary_key[32];   // tree_key of the region boundary inside the binade (INT32_MAX: none)
  float clamp[32];                 // by region: the map value of its top code (larger magnitudes get it)
  float slope[32], offset[32];     // by region: code + fraction = fma(magnitude, slope, offset)
  float margin;                    // nearer than this to a whole number, the lane goes to the search tree
};

// The encoder of one of the two dynamic maps; lives as long as the program.
struct EncodeTable {
  const float* map = nullptr;              // dynamic_map(kind).data()
  const std::uint32_t* table = nullptr;    // `buckets` positive buckets, then `buckets` negative ones
  int low_bits = 0;                        // mantissa bits below the bucket index
  std::uint32_t buckets = 0;
  std::uint8_t zero_code = 0;              // nearest code of 0
  // The search tree of tree_encode_one: thresholds on tree_key(), breadth-first (node k's children are 2k
  // and 2k + 1; node 0 unused), tree_levels deep; tree_top is the signed map's last threshold (see there).
  const std::int32_t* tree = nullptr;
  int tree_levels = 0;  // 7: signed map, 8: unsigned map
  std::int32_t tree_top = 0;
  const std::uint8_t* planes = nullptr;  // 4 x 256 bytes: byte b of map[j] at planes[256 * b + j]
  const ArithTable* arith = nullptr;
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

// What the search tree compares. Signed map: 2|x| + (x < 0), |x| clamped to 1.5 (beyond 1 every code is
// decided): the lowest bit lets one threshold per decision break ties toward the lower code on both sides,
// the higher code for x > 0 and the more negative one for x < 0. Unsigned map: the bits of x as a signed
// integer clamped to [0, bits(1.5)] (negative x: the zero code). Both are below 2^31, so threshold - key
// never overflows and its sign bit is (key > threshold).
inline std::int32_t tree_key(float x, bool is_signed) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  constexpr std::uint32_t kOneAndHalf = 0x3fc00000u;
  if (is_signed) return static_cast<std::int32_t>((std::min(u & 0x7fffffffu, kOneAndHalf) << 1) | (u >> 31));
  return std::clamp(static_cast<std::int32_t>(u), 0, static_cast<std::int32_t>(kOneAndHalf));
}

// Nearest code of x by the search tree; the same code as encode_one and quantize_nearest (checked when the
// tree is built). Each level doubles the node and adds (key > threshold), so after L levels the node is
// 2^L + the number of thresholds below the key. Unsigned map: that count is the code. Signed map: the
// tree holds the 127 decisions between codes 127 (zero) and 254, mirrored for x < 0 by the key's low bit;
// x > 0 moves up from code 127 by the count, plus one past tree_top (254 -> 255, the code of 1.0, which
// has no negative twin); x < 0 moves down by the count.
inline std::uint8_t tree_encode_one(float x, const EncodeTable& t) {
  const bool is_signed = t.tree_levels == 7;
  const std::int32_t key = tree_key(x, is_signed);
  std::uint32_t node = 1;
  for (int level = 0; level < t.tree_levels; ++level) node = 2 * node + (key > t.tree[node] ? 1u : 0u);
  if (!is_signed) return static_cast<std::uint8_t>(node - 256);
  if (key & 1) return static_cast<std::uint8_t>(255 - node);
  return static_cast<std::uint8_t>(node - 1 + (key > t.tree_top ? 1u : 0u));
}

// Nearest code of x by arithmetic, or `uncertain`. Decade k of the map (values 10^-k (0.1 + 0.9 (j + 1/2) / N),
// j < N) decides between its codes at the grid points 10^-k (0.1 + 0.9 j / N), so there
// code + fraction = fma(|x|, slope, offset) and the code is the whole part. The region (decade) comes from the
// binade, which holds at most one region boundary, and one comparison with that boundary's exact key; beyond
// a region's top code the magnitude is clamped to that code's value. Rounding moves the fma's result by far
// less than `margin` (checked for every decision when the table is built), so a result farther than that
// from a whole number has the nearest code; nearer ones are reported uncertain and the caller asks
// tree_encode_one. For x < 0 the signed map's regions count down from 254 (fma(|x|, -slope, 255 - offset)).
// Magnitudes are clamped to [ArithTable::kFloor, 1.5] and NaN counts as 1.5 with its sign, as in tree_key.
inline std::uint8_t arith_encode_one(float x, const EncodeTable& t, bool& uncertain) {
  const ArithTable& a = *t.arith;
  const bool is_signed = t.tree_levels == 7;
  const bool negative = std::bit_cast<std::uint32_t>(x) >> 31;
  const float mag = std::isnan(x) ? 1.5f : std::min(std::fabs(x), 1.5f);
  const float m = !is_signed && negative ? ArithTable::kFloor : std::max(mag, ArithTable::kFloor);
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(m);
  const auto key = static_cast<std::int32_t>(is_signed ? 2 * bits + (negative ? 1u : 0u) : bits);
  const auto binade = static_cast<int>(bits >> 23) & 31;
  const int region = a.region_below[binade] + (key > a.boundary_key[binade] ? 1 : 0) + (is_signed && negative ? 16 : 0);
  const float f = std::fma(std::min(m, a.clamp[region]), a.slope[region], a.offset[region]);
  uncertain = !(std::fabs(f - std::nearbyint(f)) > a.margin);
  return static_cast<std::uint8_t>(static_cast<int>(f));
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
// The float vector of a path's width (8 lanes: AVX2, 16: AVX-512) and x in every lane of one: the optimizers'
// coefficient registers. A traits struct, because a vector type as a template argument loses its attributes.
template <int Lanes>
struct FloatVec;
template <>
struct FloatVec<8> {
  using type = __m256;
  static type splat(float x) { return _mm256_set1_ps(x); }
};
#if defined(MEMTRAIN_OPTIM_AVX512)
template <>
struct FloatVec<16> {
  using type = __m512;
  static type splat(float x) { return _mm512_set1_ps(x); }
};
#endif

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

#if defined(MEMTRAIN_OPTIM_AVX512)
// tree_encode_one on 16 lanes, the tree in registers: levels 0-3 (nodes 1-15) in one, level 4 in one,
// level 5 in two, level 6 in four, level 7 (unsigned map only) in eight.
template <int Levels>
struct TreeRegs {
  static constexpr int kRegs = Levels == 7 ? 8 : 16;
  __m512i node[kRegs];
  __m512i top_plus_one;
  explicit TreeRegs(const EncodeTable& t) : top_plus_one(_mm512_set1_epi32(t.tree_top + 1)) {
    for (int q = 0; q < kRegs; ++q) node[q] = _mm512_loadu_si512(t.tree + 16 * q);
  }
};

// node = 2 node + (key > threshold): the sign bit of threshold - key shifted in from below.
inline __m512i tree_step(__m512i node, __m512i threshold, __m512i key) {
  return _mm512_shldi_epi32(node, _mm512_sub_epi32(threshold, key), 1);
}

// Four registers of 16 thresholds, indexed by the node's low 6 bits: bit 5 picks the pair, vpermi2d the rest.
inline __m512i tree_lookup64(const __m512i* r, __m512i node) {
  const __mmask16 upper = _mm512_test_epi32_mask(node, _mm512_set1_epi32(32));
  return _mm512_mask_mov_epi32(_mm512_permutex2var_epi32(r[0], node, r[1]), upper,
                               _mm512_permutex2var_epi32(r[2], node, r[3]));
}

template <int Levels>
inline __m512i tree_search16(const TreeRegs<Levels>& r, __m512i key) {
  __m512i node = _mm512_set1_epi32(1);
  for (int level = 0; level < 4; ++level) node = tree_step(node, _mm512_permutexvar_epi32(node, r.node[0]), key);
  node = tree_step(node, _mm512_permutexvar_epi32(node, r.node[1]), key);
  node = tree_step(node, _mm512_permutex2var_epi32(r.node[2], node, r.node[3]), key);
  node = tree_step(node, tree_lookup64(r.node + 4, node), key);
  if constexpr (Levels == 8) {
    const __mmask16 upper = _mm512_test_epi32_mask(node, _mm512_set1_epi32(64));
    const __m512i threshold =
        _mm512_mask_mov_epi32(tree_lookup64(r.node + 8, node), upper, tree_lookup64(r.node + 12, node));
    node = tree_step(node, threshold, key);
  }
  return node;
}

// The 16 codes of x (already divided by the scale), one per 32-bit lane; only the low byte is the code.
inline __m512i encode16_signed(const TreeRegs<7>& r, __m512 x) {
  // vrangeps 0x2: the smaller magnitude of x and 1.5, with the sign of x. The rotate makes 2|x| + sign.
  const __m512i key = _mm512_rol_epi32(_mm512_castps_si512(_mm512_range_ps(x, _mm512_set1_ps(1.5f), 0x2)), 1);
  const __m512i node = tree_search16(r, key);
  const __m512i up = _mm512_sub_epi32(node, _mm512_srli_epi32(_mm512_sub_epi32(key, r.top_plus_one), 31));
  const __mmask16 negative = _mm512_test_epi32_mask(key, _mm512_set1_epi32(1));
  return _mm512_mask_xor_epi32(up, negative, node, _mm512_set1_epi32(0xff));  // 255 - node
}
inline __m512i encode16_unsigned(const TreeRegs<8>& r, __m512 x) {
  const __m512i key = _mm512_min_epi32(_mm512_max_epi32(_mm512_castps_si512(x), _mm512_setzero_si512()),
                                       _mm512_set1_epi32(0x3fc00000));
  return tree_search16(r, key);  // node - 256: the low byte
}

// The lanes of a 16-lane group that hold one of the `left` remaining elements.
inline __mmask16 lanes_left(std::int64_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1);
}

// arith_encode_one's tables in registers: two per table (32 regions) for the signed map, one for the
// unsigned map (regions 0..8).
template <bool Signed>
struct ArithRegs {
  static constexpr int kRegs = Signed ? 2 : 1;
  __m512i region_below[2], boundary_key[2];
  __m512 clamp[kRegs], slope[kRegs], offset[kRegs];
  __m512 margin;
  explicit ArithRegs(const ArithTable& a) : margin(_mm512_set1_ps(a.margin)) {
    for (int q = 0; q < 2; ++q) {
      region_below[q] = _mm512_loadu_si512(a.region_below + 16 * q);
      boundary_key[q] = _mm512_loadu_si512(a.boundary_key + 16 * q);
    }
    for (int q = 0; q < kRegs; ++q) {
      clamp[q] = _mm512_loadu_ps(a.clamp + 16 * q);
      slope[q] = _mm512_loadu_ps(a.slope + 16 * q);
      offset[q] = _mm512_loadu_ps(a.offset + 16 * q);
    }
  }
  __m512 lookup(const __m512* table, __m512i region) const {
    if constexpr (Signed) return _mm512_permutex2var_ps(table[0], region, table[1]);
    else return _mm512_permutexvar_ps(region, table[0]);
  }
};

// arith_encode_one on 16 lanes of x (already divided by the scale): the codes, one per 32-bit lane (only
// the low byte is the code), and the uncertain lanes.
template <bool Signed>
inline __m512i arith_encode16(const ArithRegs<Signed>& r, __m512 x, __mmask16& uncertain) {
  // vrangeps: the smaller magnitude of x and 1.5 (NaN: 1.5), with the sign cleared (0xa) or kept (0x2).
  const __m512 m = _mm512_max_ps(_mm512_set1_ps(ArithTable::kFloor),
                                 _mm512_range_ps(x, _mm512_set1_ps(1.5f), Signed ? 0xa : 0x2));
  const __m512i bits = _mm512_castps_si512(m);
  const __m512i key = Signed ? _mm512_shldi_epi32(bits, _mm512_castps_si512(x), 1) : bits;  // 2 bits + sign
  const __m512i binade = _mm512_srli_epi32(bits, 23);
  const __m512i below = _mm512_permutex2var_epi32(r.region_below[0], binade, r.region_below[1]);
  const __mmask16 above =
      _mm512_cmpgt_epi32_mask(key, _mm512_permutex2var_epi32(r.boundary_key[0], binade, r.boundary_key[1]));
  __m512i region = _mm512_mask_sub_epi32(below, above, below, _mm512_set1_epi32(-1));
  if constexpr (Signed)  // region | (sign bit >> 27 & 16)
    region = _mm512_ternarylogic_epi32(region, _mm512_srli_epi32(_mm512_castps_si512(x), 27), _mm512_set1_epi32(16),
                                       0xf8);
  const __m512 f = _mm512_fmadd_ps(_mm512_min_ps(m, r.lookup(r.clamp, region)), r.lookup(r.slope, region),
                                   r.lookup(r.offset, region));
  // vreduceps 0: f minus f rounded to the nearest whole number.
  uncertain = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_reduce_ps(f, 0)), r.margin, _CMP_LE_OQ);
  return _mm512_cvttps_epi32(f);
}

// encode_span_scalar's codes: arith_encode16, and the search tree for the 16 lanes where any is uncertain
// (a few in a thousand groups on typical data; the tree's registers are loaded only then).
template <bool Signed>
inline void encode_span_arith(const float* src, std::int64_t len, float scale, const EncodeTable& t,
                              std::uint8_t* codes) {
  const ArithRegs<Signed> r(*t.arith);
  const __m512 inv = _mm512_set1_ps(1.0f / scale);
  auto encode = [&](__m512 x) {
    x = _mm512_mul_ps(x, inv);
    __mmask16 uncertain;
    __m512i c = arith_encode16<Signed>(r, x, uncertain);
    if (uncertain != 0) [[unlikely]] {
      if constexpr (Signed) c = encode16_signed(TreeRegs<7>(t), x);
      else c = encode16_unsigned(TreeRegs<8>(t), x);
    }
    return _mm512_cvtepi32_epi8(c);
  };
  std::int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), encode(_mm512_loadu_ps(src + i)));
  if (i < len) {
    const __mmask16 rest = lanes_left(len - i);
    _mm_mask_storeu_epi8(codes + i, rest, encode(_mm512_maskz_loadu_ps(rest, src + i)));
  }
}

// How far ahead (elements) the fused AVX-512 steps prefetch p, g and the codes. Their passes over a block
// in L1 are compute-bound and leave the memory idle meanwhile; without the prefetch a 16M-parameter AdamW8bit
// step took 1.86 ns per parameter instead of 1.16 on the Zen 5 of docs/results/optim_cpu.md.
inline constexpr std::int64_t kPrefetchAhead = 512;

// The fused steps' prefetch at element i of a block: p and g every 16 elements, each code array every 64.
template <class... Codes>
inline void prefetch_ahead(std::int64_t i, const float* p, const float* g, const Codes*... codes) {
  _mm_prefetch(reinterpret_cast<const char*>(g + i + kPrefetchAhead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + i + kPrefetchAhead), _MM_HINT_T0);
  if ((i & 63) == 0) (_mm_prefetch(reinterpret_cast<const char*>(codes + i + kPrefetchAhead), _MM_HINT_T0), ...);
}

// encode_span_scalar's codes, by arithmetic and the search tree.
[[gnu::always_inline]] inline void encode_span_avx512(const float* src, std::int64_t len, float scale,
                                                      const EncodeTable& t, std::uint8_t* codes) {
  if (scale == 0.0f) {
    std::memset(codes, t.zero_code, static_cast<std::size_t>(len));
    return;
  }
  if (t.tree_levels == 7) encode_span_arith<true>(src, len, scale, t, codes);
  else encode_span_arith<false>(src, len, scale, t, codes);
}

// The four byte planes of a map, 4 registers each.
struct DecodeRegs {
  __m512i plane[4][4];
  explicit DecodeRegs(const EncodeTable& t) {
    for (int b = 0; b < 4; ++b)
      for (int q = 0; q < 4; ++q) plane[b][q] = _mm512_loadu_si512(t.planes + 256 * b + 64 * q);
  }
};

// map[codes[i]] * scale for the 64 codes in `codes`, to out[0..63]. Each byte plane is two vpermi2b over
// 128 entries and a blend on the code's top bit; unpacking bytes to words to dwords then yields, per
// 128-bit lane L, floats 16L + 4q .. 16L + 4q + 3 in register q, so the codes' dwords are transposed (4 x 4)
// first to make register q hold floats 16q .. 16q + 15.
inline void decode64(const DecodeRegs& d, __m512i codes, __m512 scale, float* out) {
  const __m512i c =
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), codes);
  const __mmask64 upper = _mm512_movepi8_mask(c);
  __m512i byte[4];
  for (int b = 0; b < 4; ++b)
    byte[b] = _mm512_mask_mov_epi8(_mm512_permutex2var_epi8(d.plane[b][0], c, d.plane[b][1]), upper,
                                   _mm512_permutex2var_epi8(d.plane[b][2], c, d.plane[b][3]));
  const __m512i w01lo = _mm512_unpacklo_epi8(byte[0], byte[1]), w01hi = _mm512_unpackhi_epi8(byte[0], byte[1]);
  const __m512i w23lo = _mm512_unpacklo_epi8(byte[2], byte[3]), w23hi = _mm512_unpackhi_epi8(byte[2], byte[3]);
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(w01lo, w23lo)), scale));
  _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(w01lo, w23lo)), scale));
  _mm512_storeu_ps(out + 32, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(w01hi, w23hi)), scale));
  _mm512_storeu_ps(out + 48, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(w01hi, w23hi)), scale));
}

// dst[i] = map[codes[i]] * scale for i < len; a last group of fewer than 64 goes through a local buffer.
[[gnu::always_inline]] inline void decode_span_avx512(const EncodeTable& t, const std::uint8_t* codes, std::int64_t len,
                                                      float scale, float* dst) {
  const DecodeRegs d(t);
  const __m512 s = _mm512_set1_ps(scale);
  std::int64_t i = 0;
  for (; i + 64 <= len; i += 64) decode64(d, _mm512_loadu_si512(codes + i), s, dst + i);
  if (i < len) {
    alignas(64) float rest[64];
    const auto count = static_cast<std::size_t>(len - i);
    decode64(d, _mm512_maskz_loadu_epi8((~std::uint64_t{0}) >> (64 - count), codes + i), s, rest);
    std::memcpy(dst + i, rest, count * sizeof(float));
  }
}
#endif

// The encoder of the build: arithmetic (and the search tree) with AVX-512, else the table with AVX2, else the
// portable loop.
// Same codes in every case.
inline void encode_span(const float* src, std::int64_t len, float scale, const EncodeTable& t, std::uint8_t* codes) {
#if defined(MEMTRAIN_OPTIM_AVX512)
  encode_span_avx512(src, len, scale, t, codes);
#elif defined(MEMTRAIN_OPTIM_AVX2)
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
