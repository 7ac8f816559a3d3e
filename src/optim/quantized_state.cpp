// Dynamic tree maps and block-wise quantization. Encoding is the hot loop of every 8-bit optimizer step,
// so besides the reference (binary search over the sorted map, quantize_nearest) there is a table path:
// the float's sign, exponent and top mantissa bits pick a bucket narrow enough that at most one decision
// midpoint lies in it (the bucket width is chosen per map when the table is built, and every bucket is
// checked against the binary search at both ends). A bucket's 32-bit entry holds its lower code and the
// midpoint's remaining low mantissa bits, so one load and one integer comparison finish the nearest-code
// search; midpoints are exact float thresholds, so the result equals a brute-force search. The lookup and
// the AVX2 versions (one gather per 8 codes; decoding by scalar loads) are in quantized_kernels.h, shared
// with the fused optimizer steps. With AVX-512 the kernels use a binary search tree over the same exact
// thresholds (in registers, no gather) and byte planes of the map instead, and in front of the tree an
// arithmetic encoder (a multiply-add per decade, the tree only where that lands near a decision); all are
// built and checked here. Tests check every path against the binary search.
#include "memtrain/optim/quantized_state.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/state_arena.h"
#include "cpu/quantized_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace memtrain::optim {
namespace {

constexpr int kDecades = 7;  // 10^0 .. 10^-6
// The table starts at 2^-24: smaller magnitudes encode as they would at 2^-24, the zero code, since the
// smallest decision midpoint (between 0 and the smallest nonzero value) is above 1e-7 > 2^-24.
constexpr std::uint32_t kLoBits = detail::kEncodeLoBits;
using detail::encode_one;

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
  std::array<float, 256> mid_up;  // the largest float whose nearest code is i (+inf for the last)
  int low_bits = 0;               // mantissa bits below the bucket index (23 - bucket mantissa bits)
  std::uint32_t buckets = 0;      // per sign
  std::vector<std::uint32_t> table;  // positive buckets, then negative ones
  std::uint8_t zero_code = 0;
  std::array<std::int32_t, 256> tree{};    // detail::tree_encode_one's thresholds, breadth first
  std::int32_t tree_top = 0;
  std::array<std::uint8_t, 1024> planes{};  // the map's bytes, plane by plane (the AVX-512 decoder)
  std::vector<std::int32_t> thresholds;     // the tree's, ascending
  detail::ArithTable arith{};
  detail::EncodeTable view;          // what the kernels use

  explicit Encoder(bool is_signed) : map(build_map(is_signed)) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    // mid_up[i] is found exactly by nudging the rounded midpoint (ties go to the lower code), so the
    // table agrees with the brute force even one ulp from a midpoint.
    for (int i = 0; i < 255; ++i) {
      const double a = map[i], b = map[i + 1];
      auto nearer_lower = [&](float x) { return std::fabs(x - a) <= std::fabs(b - x); };
      float m = static_cast<float>((a + b) / 2.0);
      while (!nearer_lower(m)) m = std::nextafter(m, -inf);
      while (nearer_lower(std::nextafter(m, inf))) m = std::nextafter(m, inf);
      mid_up[i] = m;
    }
    mid_up[255] = inf;
    zero_code = detail::quantize_nearest(0.0f, map.data());
    // The widest buckets that work keep the table small (signed map: 6 mantissa bits, 12 KiB; unsigned:
    // 7 bits, 24 KiB of which only the positive half is used), so it stays in L1.
    bool built = false;
    for (int mant_bits = 5; mant_bits <= 12 && !built; ++mant_bits) built = build(23 - mant_bits);
    MT_CHECK(built, "dynamic_map", "no bucket width separates the decision midpoints");
    build_tree(is_signed);
    for (int j = 0; j < 256; ++j)
      for (int b = 0; b < 4; ++b)
        planes[256 * b + j] = static_cast<std::uint8_t>(std::bit_cast<std::uint32_t>(map[j]) >> (8 * b));
    build_arith(is_signed);
    view = detail::EncodeTable{map.data(), table.data(), low_bits,         buckets,      zero_code,
                               tree.data(), is_signed ? 7 : 8, tree_top, planes.data(), &arith};
    check_tree();
    check_arith();
  }

  // The sorted thresholds on detail::tree_key, laid out as a complete binary search tree. Unsigned map:
  // code i -> i + 1 past mid_up[i] (255 thresholds). Signed map: the 127 decisions between codes 127 + j
  // and 128 + j (x > 0: up past P = mid_up[127 + j]) and, mirrored, between 127 - j and 126 - j (x < 0:
  // down from |x| >= N = -mid_up[126 - j]). N is P when P is an exact tie (which goes to the lower code on
  // both sides), else the float after P; with keys 2|x| (x > 0) and 2|x| + 1 (x < 0) the threshold 2 bits(P)
  // resp. 2 bits(P) + 1 decides both sides. The last decision (254 -> 255, code 1.0) is positive only.
  void build_tree(bool is_signed) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    std::vector<std::int32_t>& sorted = thresholds;
    if (is_signed) {
      for (int j = 0; j < 127; ++j) {
        const float up = mid_up[127 + j], down = -mid_up[126 - j];
        MT_CHECK(down == up || down == std::nextafter(up, inf), "dynamic_map",
                 "the signed map is not symmetric at decision {}: {} vs {}", j, up, down);
        sorted.push_back(2 * std::bit_cast<std::int32_t>(up) + (down == up ? 0 : 1));
      }
      tree_top = 2 * std::bit_cast<std::int32_t>(mid_up[254]);
    } else {
      for (int j = 0; j < 255; ++j) sorted.push_back(std::bit_cast<std::int32_t>(mid_up[j]));
    }
    std::size_t next = 0;
    auto fill = [&](auto& self, std::size_t node) -> void {  // in-order over the tree = ascending
      if (node > sorted.size()) return;
      self(self, 2 * node);
      tree[node] = sorted[next++];
      self(self, 2 * node + 1);
    };
    fill(fill, 1);
  }

  // The tree agrees with the binary search on both sides of every map value and decision (and on the
  // floats around them), so with monotonic codes it agrees everywhere.
  void check_tree() const {
    constexpr float inf = std::numeric_limits<float>::infinity();
    for (int i = 0; i < 256; ++i)
      for (float a : {map[i], mid_up[i] == inf ? 1.5f : mid_up[i]})
        for (float x : {a, std::nextafter(a, inf), std::nextafter(a, -inf)})
          for (float y : {x, -x})
            MT_CHECK(detail::tree_encode_one(y, view) == detail::quantize_nearest(y, map.data()), "dynamic_map",
                     "the search tree encodes {} as {}, the nearest code is {}", y, detail::tree_encode_one(y, view),
                     detail::quantize_nearest(y, map.data()));
  }

  // detail::arith_encode_one's tables. Region 1..7 is decade 10^-(7 - region): its codes run from `first`
  // (just past the decision boundary[region] below it) to first + items - 1, decided at whole values of
  // code + fraction = first + (|x| / 10^-k - 0.1) items / 0.9. Region 0 is the zero code, region 8 the code of
  // 1.0 past the last decision; for x < 0 (signed map) region + 16 gives 254 - that code (255 - the fma),
  // and past the last negative value's decisions the clamp keeps it at code 0 (region 24 too).
  void build_arith(bool is_signed) {
    detail::ArithTable& a = arith;
    const int zero = zero_code;
    for (int r = 0; r < 32; ++r) {
      a.clamp[r] = 1.5f;
      a.slope[r] = 0.0f;
      a.offset[r] = 0.5f;  // code 0
    }
    a.offset[0] = static_cast<float>(zero) + 0.5f;
    if (is_signed) a.offset[16] = a.offset[0];
    std::array<float, 9> boundary{};
    std::array<std::int32_t, 9> boundary_key{};
    int first = zero + 1;
    for (int region = 1; region <= 7; ++region) {
      const int k = 7 - region, items = 1 << ((is_signed ? 6 : 7) - k);
      const double slope = items / (0.9 * std::pow(10.0, -k)), offset = first - 0.1 * items / 0.9;
      a.slope[region] = static_cast<float>(slope);
      a.offset[region] = static_cast<float>(offset);
      a.clamp[region] = map[first + items - 1];
      if (is_signed) {
        a.slope[16 + region] = static_cast<float>(-slope);
        a.offset[16 + region] = static_cast<float>(255.0 - offset);
        a.clamp[16 + region] = a.clamp[region];
      }
      boundary[region] = mid_up[first - 1];
      boundary_key[region] = thresholds[first - 1 - zero];
      first += items;
    }
    MT_CHECK(first == 255, "dynamic_map", "the decades hold codes up to {}, not 254", first - 1);
    boundary[8] = mid_up[254];
    boundary_key[8] = is_signed ? tree_top : thresholds[254];
    a.offset[8] = 255.5f;
    // Binade b holds [2^(b - 31), 2^(b - 30)) (exponents mod 32: magnitudes are in [2^-25, 1.5]). A boundary
    // exactly at a power of two would sit in two binades, and two boundaries in one would need two compares.
    for (int b = 0; b < 32; ++b) {
      const float lo = std::ldexp(1.0f, b - 31), hi = 2.0f * lo;
      int below = 0;
      while (below < 8 && boundary[below + 1] < lo) ++below;
      a.region_below[b] = below;
      a.boundary_key[b] = std::numeric_limits<std::int32_t>::max();
      if (below < 8 && boundary[below + 1] < hi) {
        MT_CHECK(boundary[below + 1] != lo && (below + 1 == 8 || boundary[below + 2] >= hi), "dynamic_map",
                 "the binade from {} holds more than the inside of one region boundary", lo);
        a.boundary_key[b] = boundary_key[below + 1];
      }
    }
    a.margin = 0x1p-12f;
  }

  // The arithmetic code is monotonic in |x| on each side of 0 (each region's fma is, and the regions follow
  // |x|), so if at both floats around every decision (and at every map value) it is either the binary
  // search's code or uncertain, then every float it does not call uncertain gets the binary search's code:
  // such an x lies farther than the margin from every whole number, hence on the same side of each decision
  // as the checked float on that side. This is where rounding in the fma is bounded.
  void check_arith() const {
    constexpr float inf = std::numeric_limits<float>::infinity();
    for (int i = 0; i < 256; ++i)
      for (float a : {map[i], mid_up[i] == inf ? 1.5f : mid_up[i]})
        for (float x : {a, std::nextafter(a, inf), std::nextafter(a, -inf)})
          for (float y : {x, -x}) {
            bool uncertain = false;
            const std::uint8_t code = detail::arith_encode_one(y, view, uncertain);
            MT_CHECK(uncertain || code == detail::quantize_nearest(y, map.data()), "dynamic_map",
                     "the arithmetic encoder gives {} code {}, the nearest code is {}", y, code,
                     detail::quantize_nearest(y, map.data()));
          }
  }

  // Fills the table for buckets of 2^low_bits floats; false when some bucket holds two decision midpoints.
  bool build(int lb) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    low_bits = lb;
    buckets = (0x3f800000u - kLoBits) >> lb;
    table.assign(2 * static_cast<std::size_t>(buckets), 0);
    const std::uint32_t low_mask = (1u << lb) - 1;
    for (std::uint32_t b = 0; b < buckets; ++b) {
      const std::uint32_t lo_bits = kLoBits + (b << lb);
      const float lo = std::bit_cast<float>(lo_bits);
      auto in_bucket = [&](float t) { return (std::bit_cast<std::uint32_t>(t) >> lb) == (lo_bits >> lb); };
      // Positive bucket [lo, hi): nearest(lo), plus one past the midpoint mid_up[base] when it is inside.
      const std::uint8_t base = detail::quantize_nearest(lo, map.data());
      const float up = mid_up[base];
      const std::int32_t t_pos = up != inf && in_bucket(up) ? static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(up) & low_mask)
                                                             : static_cast<std::int32_t>(low_mask);  // never
      table[b] = (static_cast<std::uint32_t>(t_pos) << 8) | base;
      // Negative bucket (-hi, -lo]: with c = nearest(-lo), x stays at c while x > mid_up[c - 1], i.e. while
      // |x| < T = -mid_up[c - 1], and is c - 1 beyond: code = (c - 1) + (|x| < T) = base + (~low > ~low(T)).
      const std::uint8_t c = detail::quantize_nearest(-lo, map.data());
      const float big_t = c == 0 ? inf : -mid_up[c - 1];
      const std::int32_t t_neg =
          big_t != inf && in_bucket(big_t)
              ? static_cast<std::int32_t>(low_mask ^ (std::bit_cast<std::uint32_t>(big_t) & low_mask))
              : -1;  // T beyond the bucket: always c
      table[buckets + b] = (static_cast<std::uint32_t>(t_neg) << 8) | static_cast<std::uint8_t>(c - 1);
      // Codes are monotonic in x and the entry's rule is exact at the midpoint, so agreeing with the binary
      // search at both ends of the bucket means agreeing everywhere in it.
      const float hi_last = std::bit_cast<float>(lo_bits | low_mask);
      for (float x : {lo, hi_last, -lo, -hi_last})
        if (encode_one(x, table.data(), lb, buckets) != detail::quantize_nearest(x, map.data())) return false;
    }
    return true;
  }
};

const Encoder& encoder(QuantMap m) {
  static const Encoder signed_enc(true);
  static const Encoder unsigned_enc(false);
  return m == QuantMap::signed_dynamic ? signed_enc : unsigned_enc;
}

}  // namespace

const std::array<float, 256>& dynamic_map(QuantMap map) { return encoder(map).map; }

}  // namespace memtrain::optim

namespace memtrain::detail {

const QuantCodebook& quant_codebook(QuantCodebookKind kind) {
  static const auto make = [](optim::QuantMap map) {
    const optim::detail::EncodeTable& t = optim::detail::encode_table(map);
    return QuantCodebook{t.map, t.table, t.low_bits, t.buckets, t.zero_code};
  };
  static const QuantCodebook books[2] = {make(optim::QuantMap::signed_dynamic),
                                         make(optim::QuantMap::unsigned_dynamic)};
  return books[kind == QuantCodebookKind::signed_dynamic ? 0 : 1];
}

}  // namespace memtrain::detail

namespace memtrain::optim {

namespace detail {

const EncodeTable& encode_table(QuantMap kind) { return encoder(kind).view; }

const EncodeTable& encode_table_for(const float* map) {
  const EncodeTable& s = encode_table(QuantMap::signed_dynamic);
  if (map == s.map) return s;
  const EncodeTable& u = encode_table(QuantMap::unsigned_dynamic);
  MT_CHECK(map == u.map, "quantize_block", "map is neither dynamic_map(signed) nor dynamic_map(unsigned)");
  return u;
}

std::uint8_t quantize_nearest(float x, const float* map) {
  // Largest i with map[i] <= x (0 when x is below the map), then the nearer of i and i + 1.
  int pos = 0;
  for (int step = 128; step > 0; step >>= 1)
    if (map[pos + step] <= x) pos += step;
  // Differences in double are exact for floats in [-1, 1], so ties really are ties.
  if (pos < 255 && (double(map[pos + 1]) - x) < (double(x) - map[pos])) ++pos;
  return static_cast<std::uint8_t>(pos);
}

float block_scale(const float* src, std::int64_t len) {
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
  return block_scale(hi, lo);
}

void encode_block_scalar(const float* src, std::int64_t len, float scale, const float* map, std::uint8_t* codes) {
  encode_span_scalar(src, len, scale, encode_table_for(map), codes);
}

void encode_block(const float* src, std::int64_t len, float scale, const float* map, std::uint8_t* codes) {
  encode_span(src, len, scale, encode_table_for(map), codes);
}

float quantize_block(const float* src, std::int64_t len, const float* map, std::uint8_t* codes) {
  // The scale is the block's largest-magnitude value WITH its sign, so that element maps to code 1.0
  // exactly whichever its sign (the signed map has +1 but no -1). For the unsigned map it is the max.
  const float scale = block_scale(src, len);
  encode_block(src, len, scale, map, codes);
  return scale == 0.0f ? 0.0f : scale;
}

float quantize_block_reference(const float* src, std::int64_t len, const float* map, std::uint8_t* codes) {
  float hi = 0.0f, lo = 0.0f;
  for (std::int64_t i = 0; i < len; ++i) {
    hi = std::max(hi, src[i]);
    lo = std::min(lo, src[i]);
  }
  const float scale = block_scale(hi, lo);
  if (scale == 0.0f) {
    std::fill_n(codes, len, quantize_nearest(0.0f, map));
    return 0.0f;
  }
  const float inv = 1.0f / scale;
  for (std::int64_t i = 0; i < len; ++i) codes[i] = quantize_nearest(src[i] * inv, map);
  return scale;
}

void dequantize_block(const std::uint8_t* codes, std::int64_t len, float absmax, const float* map, float* dst) {
#if defined(MEMTRAIN_OPTIM_AVX512)
  for (QuantMap kind : {QuantMap::signed_dynamic, QuantMap::unsigned_dynamic})
    if (map == encode_table(kind).map) return decode_span_avx512(encode_table(kind), codes, len, absmax, dst);
#endif
  std::int64_t i = 0;
#if defined(MEMTRAIN_OPTIM_AVX2)
  const __m256 va = _mm256_set1_ps(absmax);
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(decode8(map, codes + i), va));
#endif
  for (; i < len; ++i) dst[i] = map[codes[i]] * absmax;
}

}  // namespace detail

QuantizedState::QuantizedState(std::int64_t numel, QuantMap map, std::int64_t block_size)
    : numel_(numel), block_size_(block_size), map_kind_(map), map_(dynamic_map(map).data()) {
  MT_CHECK(numel >= 0 && block_size > 0, "QuantizedState", "numel {} and block_size {} must be positive", numel,
           block_size);
  CategoryGuard guard(MemoryCategory::optimizer_state);
  codes_ = Tensor::empty({numel}, DType::u8);
  absmax_ = Tensor::empty({num_blocks()}, DType::f32);
  // 16 MiB at a time, each handed back once written: offloaded state (core/state_arena.h) is never all resident.
  constexpr std::int64_t kPiece = std::int64_t{1} << 24;
  for (std::int64_t at = 0; at < numel; at += kPiece) {
    const std::int64_t len = std::min(kPiece, numel - at);
    std::memset(codes_.data<std::uint8_t>() + at, encoder(map).zero_code, static_cast<std::size_t>(len));
    release_state_pages(codes_.narrow(0, at, len));
  }
  std::fill_n(absmax_.data<float>(), num_blocks(), 0.0f);
  release_state_pages(absmax_);
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
#pragma omp parallel for schedule(static) if (numel_ >= detail::kParallelMinElements)
  for (std::int64_t b = 0; b < nb; ++b) quantize_block(b, src + b * block_size_);
}

void QuantizedState::dequantize(float* dst) const {
  const std::int64_t nb = num_blocks();
#pragma omp parallel for schedule(static) if (numel_ >= detail::kParallelMinElements)
  for (std::int64_t b = 0; b < nb; ++b) dequantize_block(b, dst + b * block_size_);
}

}  // namespace memtrain::optim
