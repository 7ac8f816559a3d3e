// Dynamic tree maps and block-wise quantization. Encoding is the hot loop of every 8-bit optimizer step,
// so besides the reference (binary search over the sorted map) there is a table path: the float's
// exponent and top 9 mantissa bits pick a bucket whose relative width (2^-9) is below the smallest
// relative gap between map values (0.35%), so at most one decision midpoint lies in a bucket and one
// comparison finishes the nearest-code search (midpoints are exact float thresholds, so the result equals
// a brute-force search). With AVX2 the same lookup runs 8 lanes at a time with gathers. Tests check the
// table path against a brute-force search.
#include "memtrain/optim/quantized_state.h"

#include "memtrain/core/allocator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace memtrain::optim {
namespace {

constexpr int kDecades = 7;            // 10^0 .. 10^-6
constexpr int kMinExp = 97;            // biased float exponent of 2^-30; smaller magnitudes encode as 0
constexpr int kMantBits = 9;           // mantissa bits per bucket
constexpr int kBuckets = (127 - kMinExp) << kMantBits;

std::array<float, 256> build_map(bool is_signed) {
  // Decade k (value scale 10^-k) has (signed ? 6 : 7) - k fraction bits; a fraction code j stands for the
  // midpoint of the j-th of 2^F equal intervals of [0.1, 1].
  std::vector<double> v;
  for (int k = 0; k < kDecades; ++k) {
    const int fraction_bits = (is_signed ? 6 : 7) - k;
    const int items = 1 << fraction_bits;
    for (int j = 0; j < items; ++j) {
      const double x = std::pow(10.0, -k) * (0.1 + 0.9 * (j + 0.5) / items);
      v.push_back(x);
      if (is_signed) v.push_back(-x);
    }
  }
  v.push_back(0.0);
  v.push_back(1.0);
  std::sort(v.begin(), v.end());
  std::array<float, 256> out{};
  MT_CHECK(v.size() == 256, "dynamic_map", "built {} values", v.size());
  for (int i = 0; i < 256; ++i) out[i] = static_cast<float>(v[i]);
  return out;
}

// Everything the fast encoder needs for one map.
struct Encoder {
  std::array<float, 256> map;
  std::array<float, 256> mid_up;    // midpoint to the next code (+inf for the last)
  std::array<float, 256> mid_down;  // midpoint to the previous code (-inf for the first)
  // Per bucket (positive buckets, then negative ones, by sign bit): the code is base + (x > thresh), with
  // base wrapping mod 256. Positive bucket [lo, hi): base = nearest(lo), thresh = mid_up[base]. Negative
  // bucket (-hi, -lo]: with c = nearest(-lo), base = c - 1 and thresh = mid_down[c]. Both loads depend only
  // on the bucket, not on each other.
  std::vector<std::uint8_t> base;
  std::vector<float> thresh;
  std::uint8_t zero_code = 0;

  explicit Encoder(bool is_signed) : map(build_map(is_signed)), base(2 * kBuckets + 3), thresh(2 * kBuckets) {
    // base has 3 spare bytes: the AVX2 path reads 4 bytes per lookup.
    constexpr float inf = std::numeric_limits<float>::infinity();
    // mid_up[i]: the largest float whose nearest code is i (ties go to the lower code), found exactly by
    // nudging the rounded midpoint, so encode() agrees with the brute force even one ulp from a midpoint.
    for (int i = 0; i < 255; ++i) {
      const double a = map[i], b = map[i + 1];
      auto nearer_lower = [&](float x) { return std::fabs(x - a) <= std::fabs(b - x); };
      float m = static_cast<float>((a + b) / 2.0);
      while (!nearer_lower(m)) m = std::nextafter(m, -inf);
      while (nearer_lower(std::nextafter(m, inf))) m = std::nextafter(m, inf);
      mid_up[i] = m;
    }
    mid_up[255] = inf;
    mid_down[0] = -inf;
    for (int i = 1; i < 256; ++i) mid_down[i] = mid_up[i - 1];
    zero_code = detail::quantize_nearest(0.0f, map.data());
    for (int b = 0; b < kBuckets; ++b) {
      const std::uint32_t bits = (static_cast<std::uint32_t>((b >> kMantBits) + kMinExp) << 23) |
                                 (static_cast<std::uint32_t>(b & ((1 << kMantBits) - 1)) << (23 - kMantBits));
      const float lo = std::bit_cast<float>(bits);
      const std::uint8_t up_code = detail::quantize_nearest(lo, map.data());
      base[b] = up_code;
      thresh[b] = mid_up[up_code];
      const std::uint8_t neg_code = detail::quantize_nearest(-lo, map.data());
      base[kBuckets + b] = static_cast<std::uint8_t>(neg_code - 1);  // 255 for code 0, whose thresh is -inf
      thresh[kBuckets + b] = mid_down[neg_code];
    }
  }

  // Branch-free (signs are random, so a branch on them mispredicts half the time). Magnitudes are clamped
  // into the table's range: below 2^-30 the bucket-0 code is already 0's code, and at or above 1 the top
  // bucket's base and threshold still give the nearest code (+1.0, or the most negative one).
  // NaN bits clamp to the top bucket too, so no input indexes outside the table.
  static std::uint8_t encode(float x, const std::uint8_t* base, const float* thresh) {
    constexpr std::uint32_t lo_bits = static_cast<std::uint32_t>(kMinExp) << 23;
    constexpr std::uint32_t hi_bits = 0x3f7fffffu;  // largest float below 1
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    const std::uint32_t mag = std::clamp(u & 0x7fffffffu, lo_bits, hi_bits);
    const std::uint32_t idx = ((mag >> (23 - kMantBits)) - (lo_bits >> (23 - kMantBits))) + (u >> 31) * kBuckets;
    return static_cast<std::uint8_t>(base[idx] + (x > thresh[idx]));
  }
};

const Encoder& encoder(QuantMap m) {
  static const Encoder signed_enc(true);
  static const Encoder unsigned_enc(false);
  return m == QuantMap::signed_dynamic ? signed_enc : unsigned_enc;
}

const Encoder& encoder_for(const float* map) {
  const Encoder& s = encoder(QuantMap::signed_dynamic);
  return map == s.map.data() ? s : encoder(QuantMap::unsigned_dynamic);
}

}  // namespace

const std::array<float, 256>& dynamic_map(QuantMap map) { return encoder(map).map; }

namespace detail {

std::uint8_t quantize_nearest(float x, const float* map) {
  // Largest i with map[i] <= x (0 when x is below the map), then the nearer of i and i + 1.
  int pos = 0;
  for (int step = 128; step > 0; step >>= 1)
    if (map[pos + step] <= x) pos += step;
  // Differences in double are exact for floats in [-1, 1], so ties really are ties.
  if (pos < 255 && (double(map[pos + 1]) - x) < (double(x) - map[pos])) ++pos;
  return static_cast<std::uint8_t>(pos);
}

float quantize_block(const float* src, std::int64_t len, const float* map, std::uint8_t* codes) {
  const Encoder& enc = encoder_for(map);
  // The scale is the block's largest-magnitude value WITH its sign, so that element maps to code 1.0
  // exactly whichever its sign (the signed map has +1 but no -1). For the unsigned map it is the max.
  // Max and min are plain (vectorizable) reductions; a running "largest |x|" would be a serial chain.
  // Eight independent lanes, which the compiler turns into one vector max and min per 8 elements.
  float hi8[8] = {}, lo8[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int j = 0; j < 8; ++j) {
      hi8[j] = std::max(hi8[j], src[i + j]);
      lo8[j] = std::min(lo8[j], src[i + j]);
    }
  for (; i < len; ++i) {
    hi8[0] = std::max(hi8[0], src[i]);
    lo8[0] = std::min(lo8[0], src[i]);
  }
  float hi = 0.0f, lo = 0.0f;
  for (int j = 0; j < 8; ++j) {
    hi = std::max(hi, hi8[j]);
    lo = std::min(lo, lo8[j]);
  }
  const float scale = -lo > hi ? lo : hi;
  if (scale == 0.0f) {
    std::memset(codes, enc.zero_code, static_cast<std::size_t>(len));
    return 0.0f;
  }
  const float inv = 1.0f / scale;
  // Local copies of the pointers: stores through the u8 codes may alias anything, so members would be
  // reloaded on every element.
  const std::uint8_t* base = enc.base.data();
  const float* thresh = enc.thresh.data();
  i = 0;
#if defined(__AVX2__)
  // The same computation 8 lanes at a time: byte lookups are 4-byte gathers masked to their low byte.
  {
    constexpr std::uint32_t lo_bits = static_cast<std::uint32_t>(kMinExp) << 23;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i vlo = _mm256_set1_epi32(static_cast<int>(lo_bits));
    const __m256i vhi = _mm256_set1_epi32(0x3f7fffff);
    const __m256i vbase = _mm256_set1_epi32(static_cast<int>(lo_bits >> (23 - kMantBits)));
    const __m256i vneg = _mm256_set1_epi32(kBuckets);
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i gather_lanes = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    const int* base32 = reinterpret_cast<const int*>(base);
    for (; i + 8 <= len; i += 8) {
      const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(src + i), vinv);
      const __m256i u = _mm256_castps_si256(x);
      __m256i mag = _mm256_and_si256(u, abs_mask);
      mag = _mm256_min_epu32(_mm256_max_epu32(mag, vlo), vhi);
      __m256i idx = _mm256_sub_epi32(_mm256_srli_epi32(mag, 23 - kMantBits), vbase);
      idx = _mm256_add_epi32(idx, _mm256_and_si256(_mm256_srai_epi32(u, 31), vneg));
      const __m256i c = _mm256_i32gather_epi32(base32, idx, 1);  // low byte is the base; the rest is ignored
      const __m256 t = _mm256_i32gather_ps(thresh, idx, 4);
      const __m256i code = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(x, t, _CMP_GT_OQ)));  // +1 past t
      const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(code, pick), gather_lanes);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm256_castsi256_si128(bytes));
    }
  }
#endif
  for (; i < len; ++i) codes[i] = Encoder::encode(src[i] * inv, base, thresh);
  return scale;
}

void dequantize_block(const std::uint8_t* codes, std::int64_t len, float absmax, const float* map, float* dst) {
  for (std::int64_t i = 0; i < len; ++i) dst[i] = map[codes[i]] * absmax;
}

}  // namespace detail

QuantizedState::QuantizedState(std::int64_t numel, QuantMap map, std::int64_t block_size)
    : numel_(numel), block_size_(block_size), map_kind_(map), map_(dynamic_map(map).data()) {
  MT_CHECK(numel >= 0 && block_size > 0, "QuantizedState", "numel {} and block_size {} must be positive", numel,
           block_size);
  CategoryGuard guard(MemoryCategory::optimizer_state);
  codes_ = Tensor::empty({numel}, DType::u8);
  absmax_ = Tensor::empty({num_blocks()}, DType::f32);
  std::memset(codes_.data<std::uint8_t>(), encoder(map).zero_code, static_cast<std::size_t>(numel));
  std::fill_n(absmax_.data<float>(), num_blocks(), 0.0f);
}

QuantizedState::QuantizedState(Tensor codes, Tensor absmax, QuantMap map, std::int64_t block_size)
    : codes_(std::move(codes)), absmax_(std::move(absmax)), block_size_(block_size), map_kind_(map),
      map_(dynamic_map(map).data()) {
  MT_CHECK(block_size > 0, "QuantizedState", "block_size {} must be positive", block_size);
  MT_CHECK(codes_.defined() && codes_.dtype() == DType::u8 && codes_.is_contiguous(), "QuantizedState",
           "codes must be a contiguous u8 tensor");
  numel_ = codes_.numel();
  MT_CHECK(absmax_.defined() && absmax_.dtype() == DType::f32 && absmax_.is_contiguous() &&
               absmax_.numel() == num_blocks(),
           "QuantizedState", "absmax must be contiguous f32 with {} values for {} codes in blocks of {}, got {} {}",
           num_blocks(), numel_, block_size, absmax_.defined() ? std::string(dtype_name(absmax_.dtype())) : "none",
           absmax_.defined() ? shape_str(absmax_.shape()) : "");
}

std::int64_t QuantizedState::block_length(std::int64_t b) const {
  return std::min(block_size_, numel_ - b * block_size_);
}

void QuantizedState::dequantize_block(std::int64_t b, float* dst) const {
  detail::dequantize_block(codes_.data<std::uint8_t>() + b * block_size_, block_length(b), absmax_.data<float>()[b],
                           map_, dst);
}

void QuantizedState::quantize_block(std::int64_t b, const float* src) {
  absmax_.data<float>()[b] =
      detail::quantize_block(src, block_length(b), map_, codes_.data<std::uint8_t>() + b * block_size_);
}

void QuantizedState::quantize(const float* src) {
  const std::int64_t nb = num_blocks();
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < nb; ++b) quantize_block(b, src + b * block_size_);
}

void QuantizedState::dequantize(float* dst) const {
  const std::int64_t nb = num_blocks();
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < nb; ++b) dequantize_block(b, dst + b * block_size_);
}

}  // namespace memtrain::optim
