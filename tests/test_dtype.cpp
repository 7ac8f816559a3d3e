// Exhaustive tests of the narrow float types (core/float_types.h) and of bulk conversion (cpu/convert.h).
// The reference is written here from the format definitions alone, in float64 math: a decoder from
// (sign, exponent field, mantissa field) via ldexp, a sorted table of every finite value, and a brute-force
// nearest-value encoder over that table. Nothing in it calls the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/convert.h"
#include "memtrain/core/dtype.h"
#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"

namespace memtrain {
namespace {

// ---- reference model of the formats ----------------------------------------------------------------

struct FormatDef {
  const char* name;
  int exp_bits;
  int mant_bits;
  int bias;
  bool ieee;      // all-ones exponent = Inf/NaN; otherwise E4M3 style (only S.1111.111 is NaN, no Inf)
  bool saturate;  // finite overflow -> max (fp8) instead of Inf
  int total_bits() const { return 1 + exp_bits + mant_bits; }
  std::uint32_t sign_bit() const { return 1u << (exp_bits + mant_bits); }
};

constexpr FormatDef kF16Def{"f16", 5, 10, 15, true, false};
constexpr FormatDef kBF16Def{"bf16", 8, 7, 127, true, false};
constexpr FormatDef kE4M3Def{"e4m3", 4, 3, 7, false, true};
constexpr FormatDef kE5M2Def{"e5m2", 5, 2, 15, true, true};

double ref_decode(const FormatDef& f, std::uint32_t code) {
  const bool negative = (code >> (f.exp_bits + f.mant_bits)) & 1u;
  const std::uint32_t e = (code >> f.mant_bits) & ((1u << f.exp_bits) - 1);
  const std::uint32_t m = code & ((1u << f.mant_bits) - 1);
  const std::uint32_t e_max = (1u << f.exp_bits) - 1;
  double v;
  if (f.ieee && e == e_max) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.ieee && e == e_max && m == (1u << f.mant_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mant_bits);
  } else {
    v = std::ldexp(static_cast<double>((1u << f.mant_bits) + m), static_cast<int>(e) - f.bias - f.mant_bits);
  }
  return negative ? -v : v;
}

// Every finite non-negative value of a format, ascending, with its code; plus the value just past the top
// (2^(emax+1), which an IEEE format encodes as Inf) for the overflow rounding boundary.
struct RefTable {
  FormatDef def;
  std::vector<double> values;
  std::vector<std::uint32_t> codes;
  double past_max = 0;
  std::uint32_t inf_code = 0;  // IEEE only
};

RefTable make_table(const FormatDef& f) {
  RefTable t{f, {}, {}, 0, 0};
  for (std::uint32_t c = 0; c < f.sign_bit(); ++c) {
    const double v = ref_decode(f, c);
    if (std::isfinite(v)) {
      t.values.push_back(v);
      t.codes.push_back(c);
    } else if (std::isinf(v)) {
      t.inf_code = c;
    }
  }
  std::vector<std::size_t> order(t.values.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return t.values[a] < t.values[b]; });
  std::vector<double> v2;
  std::vector<std::uint32_t> c2;
  for (auto i : order) v2.push_back(t.values[i]), c2.push_back(t.codes[i]);
  t.values = v2;
  t.codes = c2;
  const double max = t.values.back();
  t.past_max = max + (max - t.values[t.values.size() - 2]);  // one more step of the top binade
  return t;
}

const RefTable& table_for(const FormatDef& f) {
  static const RefTable f16 = make_table(kF16Def), bf16 = make_table(kBF16Def), e4m3 = make_table(kE4M3Def),
                        e5m2 = make_table(kE5M2Def);
  if (f.exp_bits == 5) return f.mant_bits == 10 ? f16 : e5m2;
  return f.exp_bits == 8 ? bf16 : e4m3;
}

// Brute-force round-to-nearest-even of a finite x >= 0 to a magnitude code (binary search in the table).
std::uint32_t ref_encode_abs(const RefTable& t, double x) {
  const double max = t.values.back();
  if (t.def.saturate && x >= max) return t.codes.back();
  if (!t.def.saturate && x >= t.past_max) return t.inf_code;
  const auto it = std::upper_bound(t.values.begin(), t.values.end(), x);
  const std::size_t k = static_cast<std::size_t>(it - t.values.begin()) - 1;  // values[k] <= x
  const double lo = t.values[k];
  if (lo == x) return t.codes[k];
  const bool has_next = k + 1 < t.values.size();
  const double hi = has_next ? t.values[k + 1] : t.past_max;
  const std::uint32_t lo_code = t.codes[k];
  const std::uint32_t hi_code = has_next ? t.codes[k + 1] : t.inf_code;
  const double mid = lo + (hi - lo) / 2;  // exact: these formats have far fewer bits than a double
  if (x < mid) return lo_code;
  if (x > mid) return hi_code;
  return (lo_code & 1u) == 0 ? lo_code : hi_code;
}

// Full reference encoder (sign, NaN, Inf) following the rules documented in float_types.h.
std::uint32_t ref_encode(const RefTable& t, double x) {
  const std::uint32_t sign = std::signbit(x) ? t.def.sign_bit() : 0u;
  if (std::isnan(x)) return sign | (t.def.ieee ? (t.inf_code | (1u << (t.def.mant_bits - 1))) : (t.def.sign_bit() - 1));
  if (std::isinf(x)) return sign | (t.def.ieee ? t.inf_code : t.def.sign_bit() - 1);
  return sign | ref_encode_abs(t, std::fabs(x));
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

template <typename T>
struct FormatOf;
template <> struct FormatOf<Half> { static constexpr const FormatDef& def = kF16Def; using Raw = std::uint16_t; };
template <> struct FormatOf<BFloat16> { static constexpr const FormatDef& def = kBF16Def; using Raw = std::uint16_t; };
template <> struct FormatOf<Float8E4M3> { static constexpr const FormatDef& def = kE4M3Def; using Raw = std::uint8_t; };
template <> struct FormatOf<Float8E5M2> { static constexpr const FormatDef& def = kE5M2Def; using Raw = std::uint8_t; };

template <typename T>
T make(std::uint32_t code) {
  return T::from_bits(static_cast<typename FormatOf<T>::Raw>(code));
}

// ---- decoding: every bit pattern ---------------------------------------------------------------------

template <typename T>
void check_all_patterns(int expected_nans, int expected_infs) {
  const FormatDef& f = FormatOf<T>::def;
  int mismatches = 0, nans = 0, infs = 0;
  for (std::uint32_t c = 0; c < (1u << f.total_bits()); ++c) {
    const double want = ref_decode(f, c);
    const float got = make<T>(c).to_float();
    nans += std::isnan(got);
    infs += std::isinf(got);
    if (!same_value(want, static_cast<double>(got)) && ++mismatches <= 5) {
      ADD_FAILURE() << f.name << " code 0x" << std::hex << c << std::dec << ": to_float " << got << ", reference "
                    << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << f.name;
  EXPECT_EQ(nans, expected_nans) << f.name;
  EXPECT_EQ(infs, expected_infs) << f.name;
}

// NaN counts from the definitions: IEEE has 2 * (2^mant - 1) NaNs and 2 Infs; E4M3 has 2 NaNs and no Inf.
TEST(DTypeDecode, HalfEveryBitPattern) { check_all_patterns<Half>(2 * 1023, 2); }
TEST(DTypeDecode, BFloat16EveryBitPattern) { check_all_patterns<BFloat16>(2 * 127, 2); }
TEST(DTypeDecode, E4M3EveryBitPattern) { check_all_patterns<Float8E4M3>(2, 0); }
TEST(DTypeDecode, E5M2EveryBitPattern) { check_all_patterns<Float8E5M2>(2 * 3, 2); }

TEST(DTypeDecode, KnownExtremes) {
  // Spot values straight from the specs, as a cross-check of the reference decoder itself.
  EXPECT_EQ(ref_decode(kF16Def, 0x7bff), 65504.0);
  EXPECT_EQ(ref_decode(kF16Def, 0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(ref_decode(kE4M3Def, 0x7e), 448.0);
  EXPECT_EQ(ref_decode(kE4M3Def, 0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(ref_decode(kE5M2Def, 0x7b), 57344.0);
  EXPECT_EQ(ref_decode(kE5M2Def, 0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(ref_decode(kBF16Def, 0x0001), std::ldexp(1.0, -133));
  EXPECT_EQ(Float8E4M3::from_bits(0x7e).to_float(), 448.0f);
  EXPECT_EQ(Float8E5M2::from_bits(0xfb).to_float(), -57344.0f);
}

// ---- encoding --------------------------------------------------------------------------------------

template <typename T>
std::uint32_t enc_f(float x) {
  return T::from_float(x).bits;
}
template <typename T>
std::uint32_t enc_d(double x) {
  return T::from_double(x).bits;
}

template <typename T>
void check_round_trip() {
  const RefTable& t = table_for(FormatOf<T>::def);
  int bad = 0;
  for (std::size_t i = 0; i < t.values.size(); ++i) {
    for (const double s : {1.0, -1.0}) {
      const double v = s * t.values[i];
      const std::uint32_t want = t.codes[i] | (s < 0 ? t.def.sign_bit() : 0u);
      if (enc_f<T>(static_cast<float>(v)) != want || enc_d<T>(v) != want) {
        if (++bad <= 5) ADD_FAILURE() << t.def.name << ": " << v << " does not round-trip";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(DTypeEncode, HalfRoundTripsEveryValue) { check_round_trip<Half>(); }
TEST(DTypeEncode, BFloat16RoundTripsEveryValue) { check_round_trip<BFloat16>(); }
TEST(DTypeEncode, E4M3RoundTripsEveryValue) { check_round_trip<Float8E4M3>(); }
TEST(DTypeEncode, E5M2RoundTripsEveryValue) { check_round_trip<Float8E5M2>(); }

// For every pair of adjacent values: the exact midpoint goes to the even code, one float/double ulp either
// side goes to the nearer one. For f16/bf16 the pair (max, 2^(emax+1)) is included: its midpoint and above
// overflow to Inf.
template <typename T>
void check_midpoints() {
  const RefTable& t = table_for(FormatOf<T>::def);
  const double inf = std::numeric_limits<double>::infinity();
  int bad = 0, pairs = 0;
  auto expect = [&](std::uint32_t got, std::uint32_t want, double x, const char* what) {
    if (got != want && ++bad <= 8) {
      ADD_FAILURE() << t.def.name << " " << what << " x=" << x << ": got 0x" << std::hex << got << ", want 0x"
                    << want;
    }
  };
  const std::size_t n = t.values.size();
  for (std::size_t i = 0; i + 1 < n + (t.def.saturate ? 0 : 1); ++i) {
    const double lo = t.values[i];
    const double hi = i + 1 < n ? t.values[i + 1] : t.past_max;
    const std::uint32_t lo_code = t.codes[i];
    const std::uint32_t hi_code = i + 1 < n ? t.codes[i + 1] : t.inf_code;
    const double mid = (lo + hi) / 2;
    ASSERT_EQ(static_cast<double>(static_cast<float>(mid)), mid) << "midpoint not exact in float";
    const std::uint32_t even = (lo_code & 1u) == 0 ? lo_code : hi_code;
    ++pairs;
    for (const double s : {1.0, -1.0}) {
      const std::uint32_t sg = s < 0 ? t.def.sign_bit() : 0u;
      const float mf = static_cast<float>(s * mid);
      expect(enc_f<T>(mf), sg | even, s * mid, "float midpoint");
      expect(enc_d<T>(s * mid), sg | even, s * mid, "double midpoint");
      const float above_f = std::nextafter(static_cast<float>(mid), static_cast<float>(inf));
      const float below_f = std::nextafter(static_cast<float>(mid), 0.0f);
      expect(enc_f<T>(static_cast<float>(s) * above_f), sg | hi_code, s * above_f, "float midpoint+ulp");
      expect(enc_f<T>(static_cast<float>(s) * below_f), sg | lo_code, s * below_f, "float midpoint-ulp");
      const double above_d = std::nextafter(mid, inf);
      const double below_d = std::nextafter(mid, 0.0);
      expect(enc_d<T>(s * above_d), sg | hi_code, s * above_d, "double midpoint+ulp");
      expect(enc_d<T>(s * below_d), sg | lo_code, s * below_d, "double midpoint-ulp");
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(pairs, static_cast<int>(n) - (t.def.saturate ? 1 : 0));
}

TEST(DTypeEncode, HalfMidpointsTieToEven) { check_midpoints<Half>(); }
TEST(DTypeEncode, BFloat16MidpointsTieToEven) { check_midpoints<BFloat16>(); }
TEST(DTypeEncode, E4M3MidpointsTieToEven) { check_midpoints<Float8E4M3>(); }
TEST(DTypeEncode, E5M2MidpointsTieToEven) { check_midpoints<Float8E5M2>(); }

TEST(DTypeEncode, OverflowHalfAndBFloat16GoToInf) {
  EXPECT_EQ(enc_f<Half>(65504.0f), 0x7bffu);
  EXPECT_EQ(enc_f<Half>(65519.0f), 0x7bffu);
  EXPECT_EQ(enc_f<Half>(65520.0f), 0x7c00u);  // midpoint to 2^16 ties to the even code: Inf
  EXPECT_EQ(enc_f<Half>(1e6f), 0x7c00u);
  EXPECT_EQ(enc_f<Half>(-1e6f), 0xfc00u);
  EXPECT_EQ(enc_f<Half>(std::numeric_limits<float>::max()), 0x7c00u);
  EXPECT_EQ(enc_d<Half>(1e300), 0x7c00u);
  EXPECT_EQ(enc_d<Half>(-std::numeric_limits<double>::max()), 0xfc00u);
  EXPECT_EQ(enc_f<BFloat16>(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(enc_f<BFloat16>(-std::numeric_limits<float>::max()), 0xff80u);
  EXPECT_EQ(enc_d<BFloat16>(1e300), 0x7f80u);
  EXPECT_EQ(enc_d<BFloat16>(std::ldexp(1.0, 128)), 0x7f80u);
}

TEST(DTypeEncode, Fp8Saturates) {
  for (const double x : {448.0, 464.0, 480.0, 1e6, 3.4e38, 1e300}) {
    EXPECT_EQ(enc_d<Float8E4M3>(x), 0x7eu) << x;
    EXPECT_EQ(enc_d<Float8E4M3>(-x), 0xfeu) << x;
    if (x < 3.5e38) {
      EXPECT_EQ(enc_f<Float8E4M3>(static_cast<float>(x)), 0x7eu) << x;
      EXPECT_EQ(enc_f<Float8E4M3>(static_cast<float>(-x)), 0xfeu) << x;
    }
  }
  for (const double x : {57344.0, 61440.0, 65536.0, 1e9, 3.4e38, 1e300}) {
    EXPECT_EQ(enc_d<Float8E5M2>(x), 0x7bu) << x;
    EXPECT_EQ(enc_d<Float8E5M2>(-x), 0xfbu) << x;
    if (x < 3.5e38) {
      EXPECT_EQ(enc_f<Float8E5M2>(static_cast<float>(x)), 0x7bu) << x;
      EXPECT_EQ(enc_f<Float8E5M2>(static_cast<float>(-x)), 0xfbu) << x;
    }
  }
  EXPECT_EQ(enc_f<Float8E4M3>(447.0f), 0x7eu);
  EXPECT_EQ(enc_f<Float8E4M3>(415.0f), 0x7du);  // below the 416 midpoint between 384 and 448
}

template <typename T>
void check_specials() {
  const FormatDef& f = FormatOf<T>::def;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const float s : {1.0f, -1.0f}) {
    const std::uint32_t sg = s < 0 ? f.sign_bit() : 0u;
    const std::uint32_t ci = enc_f<T>(s * inf), di = enc_d<T>(s * static_cast<double>(inf));
    EXPECT_EQ(ci, di) << f.name;
    if (f.ieee) {
      EXPECT_EQ(ref_decode(f, ci), static_cast<double>(s * inf)) << f.name << " Inf stays Inf";
    } else {
      EXPECT_TRUE(std::isnan(ref_decode(f, ci))) << f.name << " Inf becomes NaN";
      EXPECT_EQ(ci & f.sign_bit(), sg);
    }
    const float sn = std::copysign(nan, s);
    for (const std::uint32_t cn : {enc_f<T>(sn), enc_d<T>(static_cast<double>(sn))}) {
      EXPECT_TRUE(std::isnan(ref_decode(f, cn))) << f.name << " NaN stays NaN";
      EXPECT_EQ(cn & f.sign_bit(), sg) << f.name << " NaN keeps its sign";
      if (f.ieee) {
        EXPECT_NE(cn & (1u << (f.mant_bits - 1)), 0u) << f.name << " NaN is quiet";
      }
    }
    // A signalling float NaN (quiet bit clear) must not turn into Inf when its payload bits are dropped.
    const float snan = std::bit_cast<float>(0x7f800001u | (s < 0 ? 0x80000000u : 0u));
    EXPECT_TRUE(std::isnan(ref_decode(f, enc_f<T>(snan)))) << f.name;
  }
}

TEST(DTypeEncode, HalfInfNaN) { check_specials<Half>(); }
TEST(DTypeEncode, BFloat16InfNaN) { check_specials<BFloat16>(); }
TEST(DTypeEncode, E4M3InfNaN) { check_specials<Float8E4M3>(); }
TEST(DTypeEncode, E5M2InfNaN) { check_specials<Float8E5M2>(); }

template <typename T>
void check_zero_and_subnormal_edge() {
  const FormatDef& f = FormatOf<T>::def;
  const double min_sub = std::ldexp(1.0, 1 - f.bias - f.mant_bits);
  EXPECT_EQ(enc_f<T>(0.0f), 0u) << f.name;
  EXPECT_EQ(enc_f<T>(-0.0f), f.sign_bit()) << f.name;
  EXPECT_EQ(enc_d<T>(-0.0), f.sign_bit()) << f.name;
  for (const double s : {1.0, -1.0}) {
    const std::uint32_t sg = s < 0 ? f.sign_bit() : 0u;
    for (const double x : {min_sub, min_sub / 2, min_sub / 2 * (1 + 0x1p-10), min_sub / 4, min_sub * 0.75}) {
      const std::uint32_t want = x == min_sub / 2 || x == min_sub / 4 ? 0u : 1u;  // half ties to even (0)
      EXPECT_EQ(enc_f<T>(static_cast<float>(s * x)), sg | want) << f.name << " x=" << s * x;
      EXPECT_EQ(enc_d<T>(s * x), sg | want) << f.name << " x=" << s * x;
    }
    // Float/double subnormal inputs are far below every format's range (bf16 excepted, checked below).
    EXPECT_EQ(enc_d<T>(s * 4.9e-324), sg) << f.name;
  }
}

TEST(DTypeEncode, HalfZeroAndSubnormals) { check_zero_and_subnormal_edge<Half>(); }
TEST(DTypeEncode, BFloat16ZeroAndSubnormals) {
  check_zero_and_subnormal_edge<BFloat16>();
  // bf16 subnormals are float subnormals: exact and rounded ones must work bit-for-bit.
  EXPECT_EQ(enc_f<BFloat16>(std::numeric_limits<float>::denorm_min()), 0u);
  EXPECT_EQ(enc_f<BFloat16>(std::ldexp(1.0f, -133) * 3), 3u);
  EXPECT_EQ(enc_f<BFloat16>(std::ldexp(1.0f, -134) * 5), 2u);  // 2.5 steps -> 2 (even)
  EXPECT_EQ(enc_f<BFloat16>(std::ldexp(1.0f, -134) * 7), 4u);  // 3.5 steps -> 4 (even)
}
TEST(DTypeEncode, E4M3ZeroAndSubnormals) { check_zero_and_subnormal_edge<Float8E4M3>(); }
TEST(DTypeEncode, E5M2ZeroAndSubnormals) { check_zero_and_subnormal_edge<Float8E5M2>(); }

// ---- randomized sweep against the brute-force encoder ------------------------------------------------

template <typename T>
void check_random(int count, std::uint32_t seed) {
  const RefTable& t = table_for(FormatOf<T>::def);
  std::mt19937_64 rng(seed);
  // Half of the samples are arbitrary float bit patterns, half are concentrated on the format's range
  // (a few binades beyond it on each side), where the rounding decisions are made.
  const int lo_exp = 1 - t.def.bias - t.def.mant_bits - 3;
  const int hi_exp = static_cast<int>(std::ilogb(t.values.back())) + 3;
  std::uniform_int_distribution<int> exp_dist(lo_exp, hi_exp);
  int bad = 0, checked_f = 0;
  for (int i = 0; i < count; ++i) {
    float x;
    if (i % 2 == 0) {
      x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    } else {
      const double mant = 1.0 + static_cast<double>(rng() & 0x7fffffu) * 0x1p-23;
      x = static_cast<float>(std::ldexp(mant, exp_dist(rng)) * ((rng() & 1) ? -1.0 : 1.0));
    }
    if (std::isnan(x)) continue;
    ++checked_f;
    const std::uint32_t want = ref_encode(t, static_cast<double>(x));
    const std::uint32_t got = enc_f<T>(x);
    if (got != want && ++bad <= 5) {
      ADD_FAILURE() << t.def.name << " from_float(" << x << "): got 0x" << std::hex << got << " want 0x" << want;
    }
    // Same for a double with random low bits, through from_double.
    const double xd = static_cast<double>(x) * (1.0 + static_cast<double>(rng() & 0xfffffffu) * 0x1p-52);
    if (!std::isfinite(xd)) continue;
    const std::uint32_t want_d = ref_encode(t, xd);
    const std::uint32_t got_d = enc_d<T>(xd);
    if (got_d != want_d && ++bad <= 5) {
      ADD_FAILURE() << t.def.name << " from_double(" << xd << "): got 0x" << std::hex << got_d << " want 0x"
                    << want_d;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(checked_f, count * 9 / 10);
}

TEST(DTypeRandom, HalfMillionFloats) { check_random<Half>(1000000, 1); }
TEST(DTypeRandom, BFloat16MillionFloats) { check_random<BFloat16>(1000000, 2); }
TEST(DTypeRandom, E4M3Floats) { check_random<Float8E4M3>(200000, 3); }
TEST(DTypeRandom, E5M2Floats) { check_random<Float8E5M2>(200000, 4); }

// ---- from_double must not round twice ----------------------------------------------------------------

// Just above a midpoint, a double rounds to float as the midpoint itself; rounding that float again ties to
// even, which is wrong whenever the upper neighbour is the odd one. Find such doubles and check the direct
// path gets them right.
template <typename T>
void check_double_rounding_trap() {
  const RefTable& t = table_for(FormatOf<T>::def);
  int traps = 0, bad = 0;
  for (std::size_t i = 0; i + 1 < t.values.size(); ++i) {
    const double mid = (t.values[i] + t.values[i + 1]) / 2;
    const double x = std::nextafter(mid, 1e300);
    if (static_cast<double>(static_cast<float>(x)) != mid) continue;
    const std::uint32_t right = ref_encode_abs(t, x);
    ASSERT_EQ(right, t.codes[i + 1]);
    if (enc_f<T>(static_cast<float>(x)) == right) continue;  // via float happens to agree (upper is even)
    ++traps;
    if (enc_d<T>(x) != right && ++bad <= 5) ADD_FAILURE() << t.def.name << " from_double(" << x << ") rounded twice";
  }
  EXPECT_GT(traps, 0) << t.def.name << ": no double-rounding case found";
  EXPECT_EQ(bad, 0);
  // One concrete case: 1 + 2^-11 + 2^-40 is nearer to 1 + 2^-10 in f16, but through float it is the tie 1 + 2^-11.
  if constexpr (std::is_same_v<T, Half>) {
    const double x = 1.0 + 0x1p-11 + 0x1p-40;
    EXPECT_EQ(enc_f<Half>(static_cast<float>(x)), 0x3c00u);
    EXPECT_EQ(enc_d<Half>(x), 0x3c01u);
  }
}

TEST(DTypeDoubleRounding, Half) { check_double_rounding_trap<Half>(); }
TEST(DTypeDoubleRounding, BFloat16) { check_double_rounding_trap<BFloat16>(); }
TEST(DTypeDoubleRounding, E4M3) { check_double_rounding_trap<Float8E4M3>(); }
TEST(DTypeDoubleRounding, E5M2) { check_double_rounding_trap<Float8E5M2>(); }

// ---- bulk conversion ---------------------------------------------------------------------------------

constexpr DType kAllDTypes[] = {DType::f64,  DType::f32, DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2,
                                DType::i8,   DType::u8,  DType::i32, DType::i64,  DType::boolean};

const FormatDef* narrow_def(DType t) {
  switch (t) {
    case DType::f16: return &kF16Def;
    case DType::bf16: return &kBF16Def;
    case DType::f8_e4m3: return &kE4M3Def;
    case DType::f8_e5m2: return &kE5M2Def;
    default: return nullptr;
  }
}

bool is_int(DType t) { return t == DType::i8 || t == DType::u8 || t == DType::i32 || t == DType::i64; }

double int_min(DType t) {
  switch (t) {
    case DType::i8: return -128;
    case DType::u8: return 0;
    case DType::i32: return -2147483648.0;
    default: return -9223372036854775808.0;
  }
}
double int_max(DType t) {  // exact for the small types; i64's max is not a double, handled by the clamp test
  switch (t) {
    case DType::i8: return 127;
    case DType::u8: return 255;
    case DType::i32: return 2147483647.0;
    default: return 9223372036854775807.0;
  }
}

// Whether x is exactly a value of type t.
bool representable(DType t, double x) {
  if (t == DType::f64) return true;
  if (t == DType::f32) return std::isnan(x) || static_cast<double>(static_cast<float>(x)) == x;
  if (const FormatDef* f = narrow_def(t)) {
    if (std::isnan(x)) return true;
    if (std::isinf(x)) return f->ieee;
    const auto& v = table_for(*f).values;
    return std::binary_search(v.begin(), v.end(), std::fabs(x));
  }
  if (t == DType::boolean) return x == 0.0 || x == 1.0;
  return std::isfinite(x) && std::trunc(x) == x && x >= int_min(t) && x <= int_max(t) && std::fabs(x) < 0x1p53;
}

// Writes an exactly representable x into raw storage without the code under test.
void store_exact(DType t, double x, unsigned char* p) {
  auto put = [&](auto v) { std::memcpy(p, &v, sizeof(v)); };
  switch (t) {
    case DType::f64: put(x); return;
    case DType::f32: put(static_cast<float>(x)); return;
    case DType::i8: put(static_cast<std::int8_t>(x)); return;
    case DType::u8: put(static_cast<std::uint8_t>(x)); return;
    case DType::i32: put(static_cast<std::int32_t>(x)); return;
    case DType::i64: put(static_cast<std::int64_t>(x)); return;
    case DType::boolean: put(static_cast<std::uint8_t>(x != 0)); return;
    default: break;
  }
  const std::uint32_t code = ref_encode(table_for(*narrow_def(t)), x);  // exact value: no rounding involved
  if (dtype_size(t) == 2) put(static_cast<std::uint16_t>(code));
  else put(static_cast<std::uint8_t>(code));
}

// Reads raw storage without the code under test.
double load_ref(DType t, const unsigned char* p) {
  auto get = [&](auto v) { std::memcpy(&v, p, sizeof(v)); return v; };
  switch (t) {
    case DType::f64: return get(0.0);
    case DType::f32: return get(0.0f);
    case DType::i8: return get(std::int8_t{});
    case DType::u8: return get(std::uint8_t{});
    case DType::i32: return get(std::int32_t{});
    case DType::i64: return static_cast<double>(get(std::int64_t{}));
    case DType::boolean: return get(std::uint8_t{});  // raw byte: must be exactly 0 or 1
    default: break;
  }
  const std::uint32_t code = dtype_size(t) == 2 ? get(std::uint16_t{}) : get(std::uint8_t{});
  return ref_decode(*narrow_def(t), code);
}

// What converting the exact value x to t must give, from the documented rules.
double expected_conversion(DType t, double x) {
  if (t == DType::f64) return x;
  if (t == DType::f32) return static_cast<double>(static_cast<float>(x));  // the hardware's own IEEE rounding
  if (const FormatDef* f = narrow_def(t)) return ref_decode(*f, ref_encode(table_for(*f), x));
  if (t == DType::boolean) return x != 0.0 ? 1.0 : 0.0;  // NaN != 0
  if (std::isnan(x)) return 0.0;
  return std::clamp(std::trunc(x), int_min(t), int_max(t)) + 0.0;  // + 0.0 turns -0 into 0
}

TEST(ConvertPairs, EveryDTypePairKnownValues) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> candidates = {0.0,  -0.0,  1.0,    -1.0,   2.0,   2.5,    -2.5,  3.0,   -3.75, 0.1,
                                          1.0 / 3, 7.0, 100.0, -100.0, 127.0, 128.0,  -128.0, -129.0, 200.0,
                                          255.0, 256.0, 300.0, -300.0, 448.0, 1000.0, 2.5e-5, 65504.0, 70000.0,
                                          1e5,  -1e5,  3e9,    -3e9,   1e10,  nan,    inf,   -inf};
  int pairs = 0, elements = 0;
  for (const DType s : kAllDTypes) {
    std::vector<double> xs;
    for (const double x : candidates) {
      // An integer or bool source cannot hold -0.0: its value is +0.
      if (representable(s, x)) xs.push_back(is_int(s) || s == DType::boolean ? x + 0.0 : x);
    }
    ASSERT_GE(xs.size(), 2u) << dtype_name(s);
    std::vector<unsigned char> src(xs.size() * dtype_size(s));
    for (std::size_t i = 0; i < xs.size(); ++i) store_exact(s, xs[i], src.data() + i * dtype_size(s));
    for (const DType d : kAllDTypes) {
      // Sentinel bytes after the output catch writes past n.
      std::vector<unsigned char> dst(xs.size() * dtype_size(d) + 8, 0xAB);
      cpu::convert(src.data(), s, dst.data(), d, xs.size());
      ++pairs;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const double want = expected_conversion(d, xs[i]);
        const double got = load_ref(d, dst.data() + i * dtype_size(d));
        ++elements;
        EXPECT_TRUE(same_value(got, want)) << dtype_name(s) << " -> " << dtype_name(d) << " of " << xs[i]
                                           << ": got " << got << ", want " << want;
      }
      for (std::size_t b = xs.size() * dtype_size(d); b < dst.size(); ++b) ASSERT_EQ(dst[b], 0xAB) << "overrun";
    }
  }
  EXPECT_EQ(pairs, kNumDTypes * kNumDTypes);
  EXPECT_GT(elements, 1000);
}

template <typename S, typename D>
std::vector<D> convert_vec(const std::vector<S>& src, DType s, DType d) {
  std::vector<D> out(src.size());
  cpu::convert(src.data(), s, out.data(), d, src.size());
  return out;
}

TEST(ConvertClamp, FloatToIntTruncatesAndClamps) {
  const float finf = std::numeric_limits<float>::infinity();
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> f = {1e10f, -1e10f, 2147483648.0f, -2147483648.0f, 2147483520.0f, finf, -finf,
                                fnan,  3.99f,  -3.99f,        -0.5f};
  const std::vector<std::int32_t> want32 = {INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, 2147483520, INT32_MAX,
                                            INT32_MIN, 0,         3,         -3,        0};
  EXPECT_EQ((convert_vec<float, std::int32_t>(f, DType::f32, DType::i32)), want32);

  const std::vector<float> fu = {-1.0f, -0.5f, 255.9f, 256.0f, 1e9f, fnan, 17.7f};
  EXPECT_EQ((convert_vec<float, std::uint8_t>(fu, DType::f32, DType::u8)),
            (std::vector<std::uint8_t>{0, 0, 255, 255, 255, 0, 17}));
  const std::vector<float> fi8 = {-128.9f, -129.0f, 127.9f, 128.0f, -finf};
  EXPECT_EQ((convert_vec<float, std::int8_t>(fi8, DType::f32, DType::i8)),
            (std::vector<std::int8_t>{-128, -128, 127, 127, -128}));

  const double dnan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> d = {1e19, -1e19, 0x1p63, -0x1p63, 0x1p63 - 1024, dnan, -7.9};
  EXPECT_EQ((convert_vec<double, std::int64_t>(d, DType::f64, DType::i64)),
            (std::vector<std::int64_t>{INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, 9223372036854774784LL, 0, -7}));

  // Narrow float sources: Inf, NaN and large finite values.
  const std::vector<std::uint16_t> bf = {0x7f80, 0xff80, 0x7fc0, 0x4f80 /* 2^32 */};
  EXPECT_EQ((convert_vec<std::uint16_t, std::int32_t>(bf, DType::bf16, DType::i32)),
            (std::vector<std::int32_t>{INT32_MAX, INT32_MIN, 0, INT32_MAX}));
  EXPECT_EQ((convert_vec<std::uint16_t, std::int64_t>(bf, DType::bf16, DType::i64)),
            (std::vector<std::int64_t>{INT64_MAX, INT64_MIN, 0, 4294967296LL}));
  const std::vector<std::uint8_t> e4 = {0x7f, 0xff, 0x7e, 0xfe};  // NaN, -NaN, 448, -448
  EXPECT_EQ((convert_vec<std::uint8_t, std::int8_t>(e4, DType::f8_e4m3, DType::i8)),
            (std::vector<std::int8_t>{0, 0, 127, -128}));
  const std::vector<std::uint16_t> h = {0x7bff, 0xfbff};  // +-65504
  EXPECT_EQ((convert_vec<std::uint16_t, std::uint8_t>(h, DType::f16, DType::u8)), (std::vector<std::uint8_t>{255, 0}));
}

TEST(ConvertClamp, IntToIntSaturates) {
  const std::vector<std::int32_t> a = {300, -300, 127, -128, 255, 256, -1};
  EXPECT_EQ((convert_vec<std::int32_t, std::int8_t>(a, DType::i32, DType::i8)),
            (std::vector<std::int8_t>{127, -128, 127, -128, 127, 127, -1}));
  EXPECT_EQ((convert_vec<std::int32_t, std::uint8_t>(a, DType::i32, DType::u8)),
            (std::vector<std::uint8_t>{255, 0, 127, 0, 255, 255, 0}));
  const std::vector<std::int64_t> b = {1LL << 40, -(1LL << 40), INT64_MAX, INT64_MIN, -5};
  EXPECT_EQ((convert_vec<std::int64_t, std::int32_t>(b, DType::i64, DType::i32)),
            (std::vector<std::int32_t>{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, -5}));
  const std::vector<std::int8_t> c = {-128, -1, 0, 127};
  EXPECT_EQ((convert_vec<std::int8_t, std::uint8_t>(c, DType::i8, DType::u8)), (std::vector<std::uint8_t>{0, 0, 0, 127}));
  EXPECT_EQ((convert_vec<std::int8_t, std::int64_t>(c, DType::i8, DType::i64)),
            (std::vector<std::int64_t>{-128, -1, 0, 127}));
}

TEST(ConvertBool, NonzeroIsTrue) {
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> f = {0.0f, -0.0f, 0.5f, -1e-30f, fnan, std::numeric_limits<float>::infinity()};
  EXPECT_EQ((convert_vec<float, std::uint8_t>(f, DType::f32, DType::boolean)),
            (std::vector<std::uint8_t>{0, 0, 1, 1, 1, 1}));
  // Any nonzero byte of a bool is true, and reads back as exactly 1.
  const std::vector<std::uint8_t> b = {0, 1, 2, 255};
  EXPECT_EQ((convert_vec<std::uint8_t, float>(b, DType::boolean, DType::f32)), (std::vector<float>{0, 1, 1, 1}));
  EXPECT_EQ((convert_vec<std::uint8_t, std::int32_t>(b, DType::boolean, DType::i32)),
            (std::vector<std::int32_t>{0, 1, 1, 1}));
  EXPECT_EQ((convert_vec<std::uint8_t, std::uint16_t>(b, DType::boolean, DType::bf16)),
            (std::vector<std::uint16_t>{0, 0x3f80, 0x3f80, 0x3f80}));
  const std::vector<std::int64_t> i = {0, 5, -1, INT64_MIN};
  EXPECT_EQ((convert_vec<std::int64_t, std::uint8_t>(i, DType::i64, DType::boolean)),
            (std::vector<std::uint8_t>{0, 1, 1, 1}));
  const std::vector<std::uint16_t> bf = {0x8000, 0x0001, 0x7fc0};  // -0, smallest subnormal, NaN
  EXPECT_EQ((convert_vec<std::uint16_t, std::uint8_t>(bf, DType::bf16, DType::boolean)),
            (std::vector<std::uint8_t>{0, 1, 1}));
  const std::vector<std::uint8_t> e4 = {0x80, 0x01};  // -0, 2^-9
  EXPECT_EQ((convert_vec<std::uint8_t, std::uint8_t>(e4, DType::f8_e4m3, DType::boolean)),
            (std::vector<std::uint8_t>{0, 1}));
}

TEST(ConvertRounding, Int64ToBFloat16RoundsOnce) {
  // bf16 neighbours of 2^60: 0x5d80 = 2^60 and 0x5d81 = 2^60 + 2^53; the midpoint is 2^60 + 2^52. Plus one
  // lies above it, but i64 -> double rounds it onto the midpoint, and a second rounding would tie to 2^60.
  const std::int64_t mid = (1LL << 60) + (1LL << 52);
  const std::vector<std::int64_t> v = {mid + 1, -(mid + 1), mid, mid - 1, (1LL << 60) + (1LL << 53) + (1LL << 52)};
  EXPECT_EQ((convert_vec<std::int64_t, std::uint16_t>(v, DType::i64, DType::bf16)),
            (std::vector<std::uint16_t>{0x5d81, 0xdd81, 0x5d80, 0x5d80, 0x5d82}));
  // i64 -> f64 and f32 round once by the hardware: 2^60 + 2^52 + 1 -> nearest double is the midpoint.
  EXPECT_EQ((convert_vec<std::int64_t, double>({mid + 1}, DType::i64, DType::f64))[0], static_cast<double>(mid));
  EXPECT_EQ((convert_vec<std::int64_t, std::uint16_t>({INT64_MAX, INT64_MIN}, DType::i64, DType::f16)),
            (std::vector<std::uint16_t>{0x7c00, 0xfc00}));
  EXPECT_EQ((convert_vec<std::int64_t, std::uint8_t>({INT64_MAX, INT64_MIN}, DType::i64, DType::f8_e4m3)),
            (std::vector<std::uint8_t>{0x7e, 0xfe}));
}

TEST(ConvertRounding, F64ToNarrowIsDirect) {
  const double x = 1.0 + 0x1p-11 + 0x1p-40;  // see DTypeDoubleRounding: through float this would give 1.0
  EXPECT_EQ((convert_vec<double, std::uint16_t>({x}, DType::f64, DType::f16))[0], 0x3c01u);
  EXPECT_EQ((convert_vec<float, std::uint16_t>({static_cast<float>(x)}, DType::f32, DType::f16))[0], 0x3c00u);
}

TEST(ConvertLarge, ParallelPathMatchesScalar) {
  const std::size_t n = (std::size_t(1) << 17) + 3;  // above the OpenMP threshold, not a multiple of a block
  std::mt19937 rng(7);
  std::vector<float> src(n);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  for (auto& x : src) x = dist(rng);
  src[5] = std::numeric_limits<float>::quiet_NaN();
  src[n - 1] = -std::numeric_limits<float>::infinity();
  src[n - 2] = 1e-40f;

  const auto bf = convert_vec<float, std::uint16_t>(src, DType::f32, DType::bf16);
  const auto h = convert_vec<float, std::uint16_t>(src, DType::f32, DType::f16);
  const auto e4 = convert_vec<float, std::uint8_t>(src, DType::f32, DType::f8_e4m3);
  const auto back = convert_vec<std::uint16_t, float>(h, DType::f16, DType::f32);
  const auto i = convert_vec<float, std::int32_t>(src, DType::f32, DType::i32);
  std::size_t bad = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const double x = src[k];
    bad += bf[k] != ref_encode(table_for(kBF16Def), x);
    bad += h[k] != ref_encode(table_for(kF16Def), x);
    bad += e4[k] != ref_encode(table_for(kE4M3Def), x);
    bad += !same_value(back[k], ref_decode(kF16Def, h[k]));
    bad += static_cast<double>(i[k]) != expected_conversion(DType::i32, x);
  }
  EXPECT_EQ(bad, 0u);
}

TEST(ConvertSameType, CopiesBitsExactly) {
  const std::vector<std::uint32_t> bits = {0x7fc01234u, 0xff800000u, 0x80000000u, 0x00000001u};
  const auto out = convert_vec<std::uint32_t, std::uint32_t>(bits, DType::f32, DType::f32);
  EXPECT_EQ(out, bits);  // NaN payloads, -Inf, -0 and subnormals untouched
}

TEST(ConvertErrors, UnknownDTypeNamesTheOp) {
  float x = 1.0f, y = 0.0f;
  try {
    cpu::convert(&x, DType::f32, &y, static_cast<DType>(42), 1);
    FAIL() << "expected memtrain::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("convert"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::read_as_double(&x, static_cast<DType>(200)), Error);
  EXPECT_THROW(cpu::convert(nullptr, DType::f32, &y, DType::f16, 1), Error);
  cpu::convert(nullptr, DType::f32, nullptr, DType::f16, 0);  // n == 0 touches nothing
}

TEST(ConvertScalar, ReadAndWriteSingleElements) {
  for (const DType t : kAllDTypes) {
    unsigned char buf[8] = {};
    for (const double x : {0.0, 1.0, -2.0, 3.0, 0.25, 100.0, 1e5, -0.0}) {
      if (!representable(t, x)) continue;
      store_exact(t, x, buf);
      EXPECT_TRUE(same_value(cpu::read_as_double(buf, t), is_int(t) || t == DType::boolean ? x + 0.0 : x))
          << dtype_name(t) << " " << x;
    }
    for (const double x : {1.0 / 3, -1e10, 1e10, 0.5, -0.7, std::numeric_limits<double>::quiet_NaN()}) {
      std::memset(buf, 0xCD, sizeof(buf));
      cpu::write_from_double(buf, t, x);
      EXPECT_TRUE(same_value(load_ref(t, buf), expected_conversion(t, x))) << dtype_name(t) << " " << x;
      for (std::size_t b = dtype_size(t); b < sizeof(buf); ++b) ASSERT_EQ(buf[b], 0xCD);
    }
  }
  const std::int64_t big = (1LL << 62) + 1;
  EXPECT_EQ(cpu::read_as_double(&big, DType::i64), 0x1p62);
  const std::uint8_t seven = 7;
  EXPECT_EQ(cpu::read_as_double(&seven, DType::boolean), 1.0);
}

}  // namespace
}  // namespace memtrain
