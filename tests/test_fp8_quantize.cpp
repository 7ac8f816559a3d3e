// FP8 quantization on the CPU (amp/fp8.h) against references written here, independent of the library's
// conversions: FP8 codes are decoded by sign / exponent / mantissa bit math in double (e4m3: bias 7, no
// Inf, S.1111.111 is NaN; e5m2: bias 15, IEEE-like), and the expected code of a value is the nearest
// finite code by exhaustive search (ties to the even code), which saturates by construction.
//
// Exactness: f32 products and quotients are formed in double and rounded once to float; a product of two
// floats is exact in double, and a quotient rounded via double equals the f32 quotient (53 >= 2 * 24 + 2),
// so the expected scales, codes and dequantized values are bit-exact, and are compared bit for bit.
#include "memtrain/amp/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using amp::BlockwiseFp8;
using amp::Fp8Format;
using amp::Fp8Tiling;
using amp::QuantStats;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- independent FP8 reference ----

double decode(std::uint8_t code, bool e4m3) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (e4m3) {
    const int exp = (code >> 3) & 0xf, man = code & 0x7;
    if (exp == 15 && man == 7) return std::numeric_limits<double>::quiet_NaN();
    if (exp == 0) return sign * std::ldexp(man / 8.0, -6);
    return sign * std::ldexp(1.0 + man / 8.0, exp - 7);
  }
  const int exp = (code >> 2) & 0x1f, man = code & 0x3;
  if (exp == 31) {
    return man == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  }
  if (exp == 0) return sign * std::ldexp(man / 4.0, -14);
  return sign * std::ldexp(1.0 + man / 4.0, exp - 15);
}

double fmt_max(bool e4m3) { return e4m3 ? 448.0 : 57344.0; }

// Nearest finite code to y (a float value held exactly in a double), ties to the code with an even
// mantissa; NaN -> a NaN code, Inf -> NaN (e4m3) or Inf (e5m2). Sign kept, -0 included.
std::uint8_t reference_code(double y, bool e4m3) {
  const std::uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  if (std::isnan(y)) return sign | (e4m3 ? 0x7f : 0x7e);
  if (std::isinf(y)) return sign | (e4m3 ? 0x7f : 0x7c);
  const double a = std::fabs(y);
  int best = 0;
  double best_d = a;
  for (int c = 1; c < 0x80; ++c) {
    const double v = decode(static_cast<std::uint8_t>(c), e4m3);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(a - v);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<std::uint8_t>(sign | best);
}

// The f32 product x * scale.
float f32_mul(float x, float scale) { return static_cast<float>(static_cast<double>(x) * scale); }

bool code_is_nan(std::uint8_t c) { return std::isnan(decode(c, true)); }

struct Expected {
  std::vector<std::uint8_t> codes;
  QuantStats stats;
};

// Saturated: the value rounds past fp8_max when the format's precision continues above its range. e4m3:
// beyond 464, the midpoint of 448 (mantissa .110, even) and 480, where ties go to 448; e5m2: from 61440,
// the midpoint of 57344 (mantissa .11, odd) and 65536, where ties go to 65536.
bool rounds_past_max(double a, bool e4m3) { return e4m3 ? a > 464.0 : a >= 61440.0; }

void expect_one(Expected& e, float x, float scale, bool e4m3) {
  const float y = f32_mul(x, scale);
  const std::uint8_t code = reference_code(y, e4m3);
  e.codes.push_back(code);
  if (!std::isfinite(y)) ++e.stats.nonfinite;
  else if (rounds_past_max(std::fabs(y), e4m3)) ++e.stats.saturated;
  else if (x != 0.0f && (code & 0x7f) == 0) ++e.stats.underflowed;
}

void expect_codes_equal(const std::vector<std::uint8_t>& want, const Tensor& got, const std::vector<float>& x,
                        const std::string& what) {
  ASSERT_EQ(static_cast<std::size_t>(got.numel()), want.size()) << what;
  const auto* g = got.data<const std::uint8_t>();
  int wrong = 0;
  for (std::size_t i = 0; i < want.size() && wrong < 5; ++i) {
    if (g[i] != want[i]) {
      ++wrong;
      ADD_FAILURE() << what << ": element " << i << " x=" << x[i] << " code 0x" << std::hex << int(g[i])
                    << ", want 0x" << int(want[i]);
    }
  }
}

void expect_stats(const QuantStats& got, const QuantStats& want, const std::string& what) {
  EXPECT_EQ(got.saturated, want.saturated) << what;
  EXPECT_EQ(got.underflowed, want.underflowed) << what;
  EXPECT_EQ(got.nonfinite, want.nonfinite) << what;
}

// Magnitudes log-uniform over [2^lo, 2^hi], random signs, with zeros, -0 and specials sprinkled in.
std::vector<float> random_values(std::size_t n, int lo, int hi, std::uint32_t seed, bool specials) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> e(lo, hi);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((neg(gen) ? -1.0 : 1.0) * std::exp2(e(gen)));
  if (specials && n >= 8) {
    v[1] = 0.0f;
    v[2] = -0.0f;
    v[n / 2] = kNaN;
    v[n / 3] = -kInf;
    v[n - 2] = kInf;
  }
  return v;
}

Tensor f32_tensor(const std::vector<float>& v, const Shape& shape) { return tensor(v, shape); }

// The f32 values a bf16 tensor holds (bf16 widens by appending 16 zero bits).
std::vector<float> bf16_values(const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  const auto* b = t.data<const std::uint16_t>();
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::bit_cast<float>(std::uint32_t(b[i]) << 16);
  return out;
}

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_error(const std::string& msg, const std::string& op, const std::string& what) {
  EXPECT_NE(msg.find(op), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
}

// ---- the decoder itself, on landmarks of the OCP FP8 spec ----

TEST(Fp8Reference, DecoderLandmarks) {
  EXPECT_EQ(decode(0x7e, true), 448.0);
  EXPECT_EQ(decode(0x01, true), std::ldexp(1.0, -9));
  EXPECT_EQ(decode(0x08, true), std::ldexp(1.0, -6));
  EXPECT_EQ(decode(0xb8, true), -1.0);
  EXPECT_TRUE(std::isnan(decode(0xff, true)));
  EXPECT_EQ(decode(0x7b, false), 57344.0);
  EXPECT_EQ(decode(0x01, false), std::ldexp(1.0, -16));
  EXPECT_EQ(decode(0x3c, false), 1.0);
  EXPECT_TRUE(std::isinf(decode(0xfc, false)));
  EXPECT_TRUE(std::isnan(decode(0x7e, false)));
}

// ---- per tensor ----

TEST(Fp8Quantize, CodesAndStatsMatchReference) {
  for (const bool e4m3 : {true, false}) {
    const Fp8Format f = e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
    for (const bool bf16 : {false, true}) {
      for (const float scale : {1.0f, 0.37f, 448.0f / 3.0f, 1024.0f}) {
        // 2^-30 .. 2^18: spans underflow, subnormals, the normal range and saturation at these scales.
        const std::vector<float> v = random_values(3001, -30, 18, 7u + static_cast<unsigned>(scale), true);
        Tensor x = f32_tensor(v, {3001});
        if (bf16) x = x.to(DType::bf16);
        const std::vector<float> xv = bf16 ? bf16_values(x) : v;
        Expected want;
        for (const float xi : xv) expect_one(want, xi, scale, e4m3);
        QuantStats got;
        const Tensor q = amp::quantize_fp8(x, f, scale, &got);
        const std::string what = std::string(e4m3 ? "e4m3" : "e5m2") + (bf16 ? " bf16" : " f32") +
                                 " scale " + std::to_string(scale);
        ASSERT_EQ(q.dtype(), amp::fp8_dtype(f));
        ASSERT_EQ(q.shape(), x.shape());
        expect_codes_equal(want.codes, q, xv, what);
        expect_stats(got, want.stats, what);
        EXPECT_GT(want.stats.saturated, 0) << what;  // the inputs exercise every counter
        EXPECT_GT(want.stats.underflowed, 0) << what;
        EXPECT_EQ(want.stats.nonfinite, 3) << what;
      }
    }
  }
}

TEST(Fp8Quantize, SaturationCountedWhenTheScaleIsTooLarge) {
  const Tensor x = tensor<float>({1.0f, -2.0f, 0.4f, 0.9f, -0.001f}, {5});
  QuantStats st;
  const Tensor q = amp::quantize_fp8(x, Fp8Format::e4m3, 1000.0f, &st);  // |x| * 1000 > 464 for 3 of 5
  EXPECT_EQ(st.saturated, 3);
  EXPECT_EQ(st.underflowed, 0);
  EXPECT_EQ(st.nonfinite, 0);
  const auto* c = q.data<const std::uint8_t>();
  EXPECT_EQ(c[0], 0x7e);  // +448
  EXPECT_EQ(c[1], 0xfe);  // -448
  EXPECT_EQ(decode(c[3], true), 448.0);
  // Stats add up over calls; a scale that fits leaves the counters alone.
  amp::quantize_fp8(x, Fp8Format::e4m3, 100.0f, &st);
  EXPECT_EQ(st.saturated, 3);
}

TEST(Fp8Quantize, ProductOverflowIsNonfiniteNotSaturated) {
  const Tensor x = tensor<float>({3e38f, 1.0f}, {2});
  QuantStats st;
  const Tensor q = amp::quantize_fp8(x, Fp8Format::e5m2, 1e10f, &st);
  EXPECT_EQ(st.nonfinite, 1);
  EXPECT_EQ(st.saturated, 1);
  EXPECT_TRUE(std::isinf(decode(q.data<const std::uint8_t>()[0], false)));
}

// fp8 -> f32 (bit-exact against f32(decode * inv)) and -> bf16 (the nearest bf16 of that, ties to
// even), every code, several inverse scales.
TEST(Fp8Dequantize, EveryCodeMatchesReference) {
  std::vector<std::uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<std::uint8_t>(i);
  for (const bool e4m3 : {true, false}) {
    const DType dt = e4m3 ? DType::f8_e4m3 : DType::f8_e5m2;
    const Tensor q = from_buffer(all.data(), {16, 16}, dt, dt);
    for (const float inv : {1.0f, 0.0078125f, 3.3e-3f, 1.7e5f}) {
      const Tensor y = amp::dequantize_fp8(q, inv, DType::f32);
      const Tensor yb = amp::dequantize_fp8(q, inv, DType::bf16);
      ASSERT_EQ(y.shape(), (Shape{16, 16}));
      const auto* yf = y.data<const float>();
      const auto* yh = yb.data<const std::uint16_t>();
      for (int i = 0; i < 256; ++i) {
        const double d = decode(all[i], e4m3);
        if (std::isnan(d)) {
          EXPECT_TRUE(std::isnan(yf[i])) << i;
          EXPECT_EQ(std::signbit(yf[i]), (i & 0x80) != 0) << i;
          continue;
        }
        const float want = static_cast<float>(d * inv);
        EXPECT_EQ(std::bit_cast<std::uint32_t>(yf[i]), std::bit_cast<std::uint32_t>(want)) << "code " << i;
        // bf16: truncate, then round up when nearer (ties: to even).
        const std::uint32_t w = std::bit_cast<std::uint32_t>(want);
        const std::uint16_t lo = static_cast<std::uint16_t>(w >> 16);
        const double vlo = std::bit_cast<float>(std::uint32_t(lo) << 16);
        const double vhi = std::bit_cast<float>(std::uint32_t(lo + 1) << 16);
        const double dlo = std::fabs(want - vlo), dhi = std::fabs(vhi - want);
        const std::uint16_t want_b = (dhi < dlo || (dhi == dlo && (lo & 1))) ? lo + 1 : lo;
        EXPECT_EQ(yh[i], want_b) << "code " << i;
      }
    }
  }
}

// Quantize then dequantize with scale / inverse scale chosen from the amax: error at most half an FP8
// step, i.e. 2^-4 |x| (e4m3, 3 mantissa bits) or 2^-3 |x| (e5m2, 2 bits), for values whose scaled
// magnitude is normal; the slack factor (1 + 2^-20) covers the two f32 roundings (x * scale, q * inv).
TEST(Fp8Quantize, RoundTripWithinHalfUlp) {
  for (const bool e4m3 : {true, false}) {
    const Fp8Format f = e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
    const std::vector<float> v = random_values(4096, -12, 6, 99u, false);
    const Tensor x = f32_tensor(v, {64, 64});
    const float amax = amp::amax(x);
    const float scale = amp::fp8_max(f) / amax, inv = amax / amp::fp8_max(f);
    const Tensor back = amp::dequantize_fp8(amp::quantize_fp8(x, f, scale), inv);
    const double bound = (e4m3 ? 0x1p-4 : 0x1p-3) * (1.0 + 0x1p-20);
    const double min_normal = e4m3 ? 0x1p-6 : 0x1p-14;
    int checked = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::fabs(double(v[i]) * scale) < min_normal) continue;
      ++checked;
      EXPECT_LE(std::fabs(back.data<const float>()[i] - double(v[i])), bound * std::fabs(v[i])) << i;
    }
    EXPECT_GT(checked, 3000);
  }
}

TEST(Fp8Quantize, NonContiguousInputIsReadInLogicalOrder) {
  const std::vector<float> v = random_values(6 * 7, -3, 3, 5u, false);
  const Tensor x = f32_tensor(v, {6, 7}).t();
  const Tensor q = amp::quantize_fp8(x, Fp8Format::e4m3, 2.0f);
  const Tensor qc = amp::quantize_fp8(x.contiguous(), Fp8Format::e4m3, 2.0f);
  ASSERT_EQ(q.shape(), (Shape{7, 6}));
  for (int i = 0; i < 42; ++i) EXPECT_EQ(q.data<const std::uint8_t>()[i], qc.data<const std::uint8_t>()[i]);
  EXPECT_EQ(q.data<const std::uint8_t>()[1], reference_code(f32_mul(v[7], 2.0f), true));  // x[0][1] = v[1][0]
}

TEST(Fp8Amax, MaxAbsNaNAndEmpty) {
  EXPECT_EQ(amp::amax(tensor<float>({1.0f, -7.5f, 3.0f}, {3})), 7.5f);
  EXPECT_TRUE(std::isnan(amp::amax(tensor<float>({1.0f, kNaN, kInf}, {3}))));
  EXPECT_EQ(amp::amax(tensor<float>({1.0f, -kInf}, {2})), kInf);
  EXPECT_EQ(amp::amax(Tensor::empty({0}, DType::f32)), 0.0f);
  EXPECT_EQ(amp::amax(tensor<float>({-2.5f, 1.0f}, {2}).to(DType::bf16)), 2.5f);
}

// ---- blockwise ----

struct BlockwiseExpected {
  Expected e;
  std::vector<float> inv_scales;
  std::vector<float> scales;
};

// Tile amax by a plain loop (double, NaN-propagating); scale = fp8_max / amax and inv = amax / fp8_max
// rounded once to f32; 1 and 1 for amax 0 / Inf / NaN or an overflowing scale.
BlockwiseExpected reference_blockwise(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
                                      std::int64_t tile_rows, bool e4m3) {
  const std::int64_t sr = (rows + tile_rows - 1) / tile_rows, sc = (cols + 127) / 128;
  BlockwiseExpected r;
  r.inv_scales.assign(static_cast<std::size_t>(sr * sc), 0.0f);
  r.scales.assign(r.inv_scales.size(), 0.0f);
  for (std::int64_t t = 0; t < sr * sc; ++t) {
    double amax = 0.0;
    for (std::int64_t i = t / sc * tile_rows; i < std::min(rows, (t / sc + 1) * tile_rows); ++i) {
      for (std::int64_t j = t % sc * 128; j < std::min(cols, (t % sc + 1) * 128); ++j) {
        const double a = std::fabs(double(x[i * cols + j]));
        if (!std::isnan(amax) && (std::isnan(a) || a > amax)) amax = a;
      }
    }
    float s = 1.0f, inv = 1.0f;
    if (std::isfinite(amax) && amax > 0.0) {
      const double sd = fmt_max(e4m3) / amax;
      if (sd <= std::numeric_limits<float>::max()) {
        s = static_cast<float>(sd);
        inv = static_cast<float>(amax / fmt_max(e4m3));
      }
    }
    r.scales[t] = s;
    r.inv_scales[t] = inv;
  }
  r.e.codes.reserve(x.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      expect_one(r.e, x[i * cols + j], r.scales[(i / tile_rows) * sc + j / 128], e4m3);
    }
  }
  return r;
}

TEST(Fp8Blockwise, TileScalesCodesAndStatsMatchReference) {
  struct Case {
    Shape shape;
    Fp8Tiling tiling;
  };
  // Partial edge tiles in both directions, a 3-D input (rows = 2 * 5), a 1-D one (one row), exact fits.
  const std::vector<Case> cases = {{{3, 300}, Fp8Tiling::row_1x128},     {{130, 260}, Fp8Tiling::block_128x128},
                                   {{2, 5, 200}, Fp8Tiling::row_1x128},  {{2, 5, 200}, Fp8Tiling::block_128x128},
                                   {{300}, Fp8Tiling::block_128x128},    {{256, 128}, Fp8Tiling::block_128x128},
                                   {{4, 128}, Fp8Tiling::row_1x128}};
  std::uint32_t seed = 1;
  for (const auto& c : cases) {
    for (const bool e4m3 : {true, false}) {
      for (const bool bf16 : {false, true}) {
        const std::int64_t n = shape_numel(c.shape), cols = c.shape.back(), rows = n / cols;
        const std::int64_t tile_rows = c.tiling == Fp8Tiling::row_1x128 ? 1 : 128;
        const std::vector<float> v = random_values(static_cast<std::size_t>(n), -20, 10, ++seed, true);
        Tensor x = f32_tensor(v, c.shape);
        if (bf16) x = x.to(DType::bf16);
        const std::vector<float> xv = bf16 ? bf16_values(x) : v;
        const BlockwiseExpected want = reference_blockwise(xv, rows, cols, tile_rows, e4m3);
        QuantStats st;
        const BlockwiseFp8 q = amp::quantize_fp8_blockwise(x, e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2, c.tiling, &st);
        const std::string what = shape_str(c.shape) + (tile_rows == 1 ? " 1x128 " : " 128x128 ") +
                                 (e4m3 ? "e4m3" : "e5m2") + (bf16 ? " bf16" : " f32");
        ASSERT_EQ(q.codes.shape(), c.shape) << what;
        ASSERT_EQ(q.inv_scales.shape(), (Shape{(rows + tile_rows - 1) / tile_rows, (cols + 127) / 128})) << what;
        ASSERT_EQ(q.inv_scales.dtype(), DType::f32);
        EXPECT_EQ(q.tiling, c.tiling);
        for (std::size_t t = 0; t < want.inv_scales.size(); ++t) {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(q.inv_scales.data<const float>()[t]),
                    std::bit_cast<std::uint32_t>(want.inv_scales[t]))
              << what << " tile " << t;
        }
        expect_codes_equal(want.e.codes, q.codes, xv, what);
        expect_stats(st, want.e.stats, what);

        // Dequantize: bit-exact f32(decode(code) * inv_scale of the tile); NaN codes stay NaN.
        const Tensor back = amp::dequantize_fp8_blockwise(q);
        ASSERT_EQ(back.shape(), c.shape);
        const std::int64_t sc = (cols + 127) / 128;
        for (std::int64_t i = 0; i < rows; ++i) {
          for (std::int64_t j = 0; j < cols; ++j) {
            const std::uint8_t code = want.e.codes[i * cols + j];
            const float got = back.data<const float>()[i * cols + j];
            const double d = decode(code, e4m3);
            if (std::isnan(d)) {
              EXPECT_TRUE(std::isnan(got)) << what;
              continue;
            }
            const float w = static_cast<float>(d * want.inv_scales[(i / tile_rows) * sc + j / 128]);
            EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(w))
                << what << " " << i << "," << j;
          }
        }
      }
    }
  }
}

// One 1x128 row with four tiles: all zeros; one outlier among small values; a NaN; an Inf.
TEST(Fp8Blockwise, ZeroOutlierNaNAndInfTiles) {
  std::vector<float> v(4 * 128, 0.0f);
  for (int j = 128; j < 256; ++j) v[j] = 1e-3f * (1 + j % 3);  // 1e-3 .. 3e-3
  v[200] = 1e4f;                                                 // the outlier: scale 448 / 1e4
  for (int j = 256; j < 384; ++j) v[j] = 0.5f;
  v[300] = kNaN;
  for (int j = 384; j < 512; ++j) v[j] = -0.25f;
  v[400] = kInf;
  QuantStats st;
  const BlockwiseFp8 q =
      amp::quantize_fp8_blockwise(f32_tensor(v, {1, 512}), Fp8Format::e4m3, Fp8Tiling::row_1x128, &st);
  const float* inv = q.inv_scales.data<const float>();
  const std::uint8_t* c = q.codes.data<const std::uint8_t>();
  EXPECT_EQ(inv[0], 1.0f);  // all-zero tile: scale 1, codes +0, nothing counted as underflow
  for (int j = 0; j < 128; ++j) EXPECT_EQ(c[j], 0x00) << j;
  EXPECT_EQ(inv[1], static_cast<float>(1e4f / 448.0));
  EXPECT_EQ(decode(c[200], true), 448.0);
  // 3e-3 * 448 / 1e4 = 1.3e-4 is below half the smallest e4m3 subnormal (2^-10): the other 127 are lost.
  for (int j = 128; j < 256; ++j) {
    if (j != 200) {
      EXPECT_EQ(c[j], 0x00) << j;
    }
  }
  EXPECT_EQ(st.underflowed, 127);
  EXPECT_EQ(inv[2], 1.0f);  // NaN tile: scale 1, the NaN stays NaN, the rest quantize unscaled
  EXPECT_TRUE(code_is_nan(c[300]));
  EXPECT_EQ(decode(c[301], true), 0.5);
  EXPECT_EQ(inv[3], 1.0f);  // Inf tile: scale 1; Inf has no e4m3 code and becomes NaN
  EXPECT_TRUE(code_is_nan(c[400]));
  EXPECT_EQ(decode(c[401], true), -0.25);
  EXPECT_EQ(st.nonfinite, 2);
  EXPECT_EQ(st.saturated, 0);

  const Tensor back = amp::dequantize_fp8_blockwise(q, DType::bf16).to(DType::f32);
  EXPECT_TRUE(std::isnan(back.data<const float>()[300]));
  EXPECT_EQ(back.data<const float>()[301], 0.5f);
  EXPECT_NEAR(back.data<const float>()[200], 1e4, 1e4 * 0x1p-8);  // 448 * inv, rounded to bf16
}

TEST(Fp8Blockwise, RoundTripWithinHalfUlp) {
  for (const bool e4m3 : {true, false}) {
    for (const Fp8Tiling t : {Fp8Tiling::row_1x128, Fp8Tiling::block_128x128}) {
      const std::vector<float> v = random_values(200 * 300, -8, 8, 31u, false);
      const Tensor x = f32_tensor(v, {200, 300});
      const BlockwiseFp8 q = amp::quantize_fp8_blockwise(x, e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2, t);
      const Tensor back = amp::dequantize_fp8_blockwise(q);
      const std::int64_t tile_rows = t == Fp8Tiling::row_1x128 ? 1 : 128;
      const double bound = (e4m3 ? 0x1p-4 : 0x1p-3) * (1.0 + 0x1p-20);
      const double min_normal = e4m3 ? 0x1p-6 : 0x1p-14;
      int checked = 0;
      for (std::int64_t i = 0; i < 200; ++i) {
        for (std::int64_t j = 0; j < 300; ++j) {
          const double xv = v[i * 300 + j];
          const double inv = q.inv_scales.data<const float>()[(i / tile_rows) * 3 + j / 128];
          if (std::fabs(xv) / inv < min_normal) continue;
          ++checked;
          EXPECT_LE(std::fabs(back.data<const float>()[i * 300 + j] - xv), bound * std::fabs(xv)) << i << "," << j;
        }
      }
      EXPECT_GT(checked, 200 * 300 / 2);
    }
  }
}

// ---- bad input ----

TEST(Fp8Quantize, BadInputNamesTheOpAndTheProblem) {
  const Tensor x = tensor<float>({1.0f, 2.0f}, {2});
  expect_error(error_of([&] { amp::quantize_fp8(x.to(DType::f64), Fp8Format::e4m3, 1.0f); }), "amp::quantize_fp8",
               "dtype f64");
  expect_error(error_of([&] { amp::quantize_fp8(tensor<float>({1.0f}, {}), Fp8Format::e4m3, 1.0f); }),
               "amp::quantize_fp8", "0-dim");
  expect_error(error_of([&] { amp::quantize_fp8(x, Fp8Format::e4m3, kNaN); }), "amp::quantize_fp8", "scale");
  expect_error(error_of([&] { amp::quantize_fp8(x, Fp8Format::e4m3, kInf); }), "amp::quantize_fp8", "finite");
  expect_error(error_of([&] { amp::quantize_fp8(x, Fp8Format::e5m2, 0.0f); }), "amp::quantize_fp8", "> 0");
  expect_error(error_of([&] { amp::quantize_fp8(x, Fp8Format::e5m2, -2.0f); }), "amp::quantize_fp8", "> 0");
  expect_error(error_of([&] { amp::amax(x.to(DType::f16)); }), "amp::amax", "dtype f16");
  expect_error(error_of([&] { amp::quantize_fp8_blockwise(x.to(DType::i32), Fp8Format::e4m3, Fp8Tiling::row_1x128); }),
               "amp::quantize_fp8_blockwise", "dtype i32");
  expect_error(error_of([&] { amp::quantize_fp8_blockwise(tensor<float>({1.0f}, {}), Fp8Format::e4m3,
                                                          Fp8Tiling::row_1x128); }),
               "amp::quantize_fp8_blockwise", "0-dim");

  const Tensor q = amp::quantize_fp8(x, Fp8Format::e4m3, 1.0f);
  expect_error(error_of([&] { amp::dequantize_fp8(x, 1.0f); }), "amp::dequantize_fp8", "not an FP8 dtype");
  expect_error(error_of([&] { amp::dequantize_fp8(q, 1.0f, DType::f16); }), "amp::dequantize_fp8", "output dtype f16");
  expect_error(error_of([&] { amp::dequantize_fp8(q, 0.0f); }), "amp::dequantize_fp8", "inv_scale");
  BlockwiseFp8 b = amp::quantize_fp8_blockwise(tensor<float>(std::vector<float>(300, 1.0f), {2, 150}),
                                               Fp8Format::e5m2, Fp8Tiling::row_1x128);
  b.tiling = Fp8Tiling::block_128x128;  // the scales are (2, 2); 128x128 tiles want (1, 2)
  expect_error(error_of([&] { amp::dequantize_fp8_blockwise(b); }), "amp::dequantize_fp8_blockwise",
               "want [1, 2]");
}

}  // namespace
}  // namespace memtrain
