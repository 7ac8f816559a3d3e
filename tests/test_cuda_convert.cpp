// CUDA conversions, FP8 scaling and reductions (src/cuda/convert.h) against host references:
// cpu::convert and core/float_types.h for casts and FP8 codes, float64 arithmetic for scales and sums.
// Casts and FP8 codes must match bit for bit; sums within rel 1e-5 of the float64 sum (see each test).
// CudaConvertRules checks the kernels' bit-level rules (kernels/convert.cuh, host-callable) in every
// build, GPU or not; device tests skip with cuda::unavailable_reason() when no usable device exists.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"
#include "cuda/convert.h"
#include "cuda/device_ops.h"

#include "cpu/convert.h"

// The kernels' conversion rules, host-callable and free of CUDA headers in this mode (the test target
// has neither the project root nor the CUDA headers on its include path, hence the relative path).
#define MEMTRAIN_CONVERT_RULES_ONLY
#include "../kernels/convert.cuh"

#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace memtrain {
namespace {

using test_support::device_allocator;
using test_support::DeviceBuffer;
using test_support::download;
using test_support::upload;

using Bytes = std::vector<std::uint8_t>;

constexpr DType kFloatTypes[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();


template <typename T>
void append_bytes(Bytes& out, T v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float bf16_value(std::uint16_t b) { return BFloat16::from_bits(b).to_float(); }
float fp8_value(std::uint8_t q, bool e4m3) {
  return e4m3 ? Float8E4M3::from_bits(q).to_float() : Float8E5M2::from_bits(q).to_float();
}
std::uint8_t fp8_code(float v, bool e4m3) {
  return e4m3 ? Float8E4M3::from_float(v).bits : Float8E5M2::from_float(v).bits;
}

// ---- inputs: every pattern of the narrow formats; around every rounding boundary for f32 / f64 ----

// Each finite non-negative value of the narrow format T, the midpoint to the next one (a tie), and for the
// largest finite value the midpoint to where the next value would be (the overflow / saturation edge).
template <typename T, typename Code>
std::vector<double> boundaries(Code max_finite) {
  std::vector<double> out;
  for (std::uint32_t c = 0; c <= max_finite; ++c) {
    const double v = T::from_bits(static_cast<Code>(c)).to_float();
    const double next = c < max_finite ? double(T::from_bits(static_cast<Code>(c + 1)).to_float())
                                       : 2 * v - double(T::from_bits(static_cast<Code>(c - 1)).to_float());
    out.push_back(v);
    out.push_back((v + next) / 2);  // exact in f64, and in f32 for these formats
  }
  return out;
}

std::vector<double> narrow_boundaries() {
  std::vector<double> all;
  for (const auto& part : {boundaries<Half, std::uint16_t>(0x7bff), boundaries<BFloat16, std::uint16_t>(0x7f7f),
                           boundaries<Float8E4M3, std::uint8_t>(0x7e), boundaries<Float8E5M2, std::uint8_t>(0x7b)}) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// f32 sources: each boundary, its f32 neighbours, both signs; specials; random bit patterns.
Bytes f32_pool() {
  std::vector<float> v;
  for (double d : narrow_boundaries()) {
    const float f = static_cast<float>(d);
    for (float g : {f, std::nextafter(f, INFINITY), std::nextafter(f, 0.f)}) {
      v.push_back(g);
      v.push_back(-g);
    }
  }
  for (std::uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
                          0xff800001u, 0x7fbfffffu, 0x7fc12345u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu,
                          0xff7fffffu, 0x7f000000u, 0x47800000u, 0x477ff000u, 0x477fefffu}) {
    v.push_back(std::bit_cast<float>(b));
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 100000; ++i) v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  Bytes out;
  for (float f : v) append_bytes(out, f);
  return out;
}

// f64 sources: the narrow boundaries and the f32 ones (sampled: subnormal range, the normal edge, the top,
// random codes), each with its f64 neighbours and both signs; specials; random bit patterns.
Bytes f64_pool() {
  std::vector<double> b = narrow_boundaries();
  std::mt19937 rng(12);
  auto add_f32_code = [&](std::uint32_t c) {
    const double v = std::bit_cast<float>(c), next = std::bit_cast<float>(c + 1);
    b.push_back(v);
    b.push_back((v + next) / 2);
  };
  for (std::uint32_t c = 0; c < 300; ++c) add_f32_code(c);
  for (std::uint32_t c = 0x007fff00; c < 0x00800100; ++c) add_f32_code(c);
  for (std::uint32_t c = 0x7f7fff00; c < 0x7f800000; ++c) add_f32_code(c);  // 0x7f7fffff + 1 is Inf: the edge
  for (int i = 0; i < 20000; ++i) add_f32_code(static_cast<std::uint32_t>(rng()) % 0x7f800000u);
  std::vector<double> v;
  for (double d : b) {
    for (double g : {d, std::nextafter(d, INFINITY), std::nextafter(d, 0.0)}) {
      v.push_back(g);
      v.push_back(-g);
    }
  }
  for (std::uint64_t x : {0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000001ull,
                          0x7ff0000000000001ull, 0x7ff4000020000000ull, 0x0000000000000001ull, 0x7fefffffffffffffull,
                          0x8010000000000000ull, 0x47efffffe0000000ull, 0x47efffffefffffffull, 0x36a0000000000000ull}) {
    v.push_back(std::bit_cast<double>(x));
  }
  std::mt19937_64 rng64(13);
  for (int i = 0; i < 100000; ++i) v.push_back(std::bit_cast<double>(rng64()));
  Bytes out;
  for (double d : v) append_bytes(out, d);
  return out;
}

// Every bit pattern of a 1- or 2-byte format; the pools above for f32 / f64.
Bytes source_pool(DType t) {
  Bytes out;
  if (dtype_size(t) == 1) {
    for (int c = 0; c < 256; ++c) out.push_back(static_cast<std::uint8_t>(c));
  } else if (dtype_size(t) == 2) {
    for (std::uint32_t c = 0; c < 65536; ++c) append_bytes(out, static_cast<std::uint16_t>(c));
  } else {
    out = t == DType::f32 ? f32_pool() : f64_pool();
  }
  return out;
}

Bytes cpu_convert(const Bytes& src, DType from, DType to) {
  const std::size_t n = src.size() / dtype_size(from);
  Bytes out(n * dtype_size(to));
  cpu::convert(src.data(), from, out.data(), to, n);
  return out;
}

std::size_t count_differences(const Bytes& a, const Bytes& b, std::size_t element_size) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i + element_size <= std::min(a.size(), b.size()); i += element_size) {
    wrong += std::memcmp(a.data() + i, b.data() + i, element_size) != 0;
  }
  return wrong + (a.size() != b.size());
}

// "code 0x7f: got 7fffffff, want 7ff00000" for the first element that differs ("" when none does).
std::string first_difference(const Bytes& got, const Bytes& want, std::size_t element_size, const Bytes& codes) {
  for (std::size_t i = 0; i < codes.size() && (i + 1) * element_size <= std::min(got.size(), want.size()); ++i) {
    std::uint32_t g = 0, w = 0;
    std::memcpy(&g, got.data() + i * element_size, element_size);
    std::memcpy(&w, want.data() + i * element_size, element_size);
    if (g != w) return fmt::format("element {} (code {:#04x}): got {:08x}, want {:08x}", i, codes[i], g, w);
  }
  return "";
}

// ---- the kernels' conversion rules, on the host (no device needed, in any build) ----

template <typename F>
void visit_format(DType t, F&& f) {
  using cuda::FloatFormat;
  switch (t) {
    case DType::f64: return f(std::integral_constant<FloatFormat, FloatFormat::f64>{});
    case DType::f32: return f(std::integral_constant<FloatFormat, FloatFormat::f32>{});
    case DType::f16: return f(std::integral_constant<FloatFormat, FloatFormat::f16>{});
    case DType::bf16: return f(std::integral_constant<FloatFormat, FloatFormat::bf16>{});
    case DType::f8_e4m3: return f(std::integral_constant<FloatFormat, FloatFormat::e4m3>{});
    case DType::f8_e5m2: return f(std::integral_constant<FloatFormat, FloatFormat::e5m2>{});
    default: FAIL() << "not a float dtype";
  }
}

Bytes rules_convert(const Bytes& src, DType from, DType to) {
  Bytes out;
  visit_format(from, [&](auto f) {
    visit_format(to, [&](auto t) {
      using S = cuda::cvt::StorageT<decltype(f)::value>;
      using D = cuda::cvt::StorageT<decltype(t)::value>;
      for (std::size_t i = 0; i + sizeof(S) <= src.size(); i += sizeof(S)) {
        S s;
        std::memcpy(&s, src.data() + i, sizeof(S));
        append_bytes(out, static_cast<D>(cuda::cvt::convert<decltype(f)::value, decltype(t)::value>(s)));
      }
    });
  });
  return out;
}

// The same inputs as CudaCast, through the rules compiled for the host: catches a rule error with a clear
// message even where no GPU is present. (All 2^32 f32 patterns were also checked once, offline.)
TEST(CudaConvertRules, MatchCpuConvertForEveryFloatPair) {
  for (DType from : kFloatTypes) {
    const Bytes src = source_pool(from);
    for (DType to : kFloatTypes) {
      SCOPED_TRACE(fmt::format("{} -> {}", dtype_name(from), dtype_name(to)));
      EXPECT_EQ(count_differences(rules_convert(src, from, to), cpu_convert(src, from, to), dtype_size(to)), 0u);
    }
  }
}

// ---- argument errors (before any device is touched, so they run without a GPU too) ----

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CudaConvertErrors, BadArgumentsThrowBeforeTouchingTheDevice) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "built without CUDA";
  float host[64] = {};
  float* p = host;
  auto expect = [](const std::string& what, const std::string& prefix, const std::string& part) {
    EXPECT_EQ(what.rfind(prefix + ": ", 0), 0u) << what;
    EXPECT_NE(what.find(part), std::string::npos) << what;
  };
  expect(error_of([&] { cuda::cast(p, DType::i32, p + 32, DType::f32, 4, 0); }), "cuda::cast", "i32 -> f32");
  expect(error_of([&] { cuda::cast(p, DType::f32, nullptr, DType::f16, 4, 0); }), "cuda::cast", "null pointer");
  expect(error_of([&] { cuda::cast(p, DType::f32, p + 1, DType::f16, 4, 0); }), "cuda::cast", "overlap");
  expect(error_of([&] { cuda::cast(p, DType::f32, p, DType::f16, 4, 0); }), "cuda::cast", "overlap");
  expect(error_of([&] { cuda::quantize_fp8(p, DType::f16, 1.f, p + 32, DType::f8_e4m3, 4, nullptr, 0); }),
         "cuda::quantize_fp8", "source dtype f16");
  expect(error_of([&] { cuda::quantize_fp8(p, DType::f32, 1.f, p + 32, DType::bf16, 4, nullptr, 0); }),
         "cuda::quantize_fp8", "destination dtype bf16");
  expect(error_of([&] { cuda::quantize_fp8(p, DType::f32, p + 40, p + 32, DType::f8_e4m3, 4, p + 40, 0); }),
         "cuda::quantize_fp8", "different");
  expect(error_of([&] { cuda::quantize_fp8(p, DType::f32, static_cast<const float*>(nullptr), p + 32,
                                           DType::f8_e4m3, 4, nullptr, 0); }),
         "cuda::quantize_fp8", "null scale");
  expect(error_of([&] { cuda::dequantize_fp8(p, DType::f32, 1.f, p + 32, DType::f32, 4, 0); }),
         "cuda::dequantize_fp8", "source dtype f32");
  expect(error_of([&] { cuda::dequantize_fp8(p, DType::f8_e5m2, 1.f, p + 32, DType::f16, 4, 0); }),
         "cuda::dequantize_fp8", "destination dtype f16");
  expect(error_of([&] { cuda::quantize_fp8_blockwise(p, DType::f32, p + 32, DType::f8_e4m3, p + 48, -1, 4,
                                                     cuda::Fp8Tiling::row_1x128, 0); }),
         "cuda::quantize_fp8_blockwise", "negative shape");
  expect(error_of([&] { cuda::quantize_fp8_blockwise(p, DType::f32, p + 32, DType::f8_e4m3, nullptr, 2, 2,
                                                     cuda::Fp8Tiling::block_128x128, 0); }),
         "cuda::quantize_fp8_blockwise", "null inverse-scale");
  expect(error_of([&] { cuda::dequantize_fp8_blockwise(p, DType::f8_e4m3, p + 48, p + 32, DType::f64, 2, 2,
                                                       cuda::Fp8Tiling::row_1x128, 0); }),
         "cuda::dequantize_fp8_blockwise", "destination dtype f64");
  expect(error_of([&] { cuda::amax(p, DType::f64, 4, p + 32, 0); }), "cuda::amax", "dtype f64");
  expect(error_of([&] { cuda::sum(p, DType::i32, 4, p + 32, 0); }), "cuda::sum", "dtype i32");
  expect(error_of([&] { cuda::sum(p, DType::f32, 4, nullptr, 0); }), "cuda::sum", "null pointer");
  expect(error_of([&] { cuda::sum_rows(p, DType::f32, 3, -2, p + 32, 0); }), "cuda::sum_rows", "negative shape");
  // Nothing to do: returns without needing a device.
  EXPECT_NO_THROW(cuda::cast(nullptr, DType::f32, nullptr, DType::bf16, 0, 0));
  EXPECT_NO_THROW(cuda::sum_rows(nullptr, DType::f32, 0, 5, nullptr, 0));
}

// ---- cast ----

// Sizes: small odd ones, then the whole pool (every pattern / boundary value) at an unaligned offset.
TEST(CudaCast, EveryFloatPairMatchesCpuConvertBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::size_t kGuard = 16;  // elements after the output that must stay poisoned
  std::mt19937_64 rng(21);
  for (DType from : kFloatTypes) {
    const Bytes pool = source_pool(from);
    const std::size_t ss = dtype_size(from), pool_n = pool.size() / ss;
    for (DType to : kFloatTypes) {
      const std::size_t ds = dtype_size(to);
      for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{127}, std::size_t{1000}, std::size_t{4097},
                            pool_n}) {
        SCOPED_TRACE(fmt::format("{} -> {}, n = {}", dtype_name(from), dtype_name(to), n));
        const std::size_t start = n == pool_n ? 0 : rng() % pool_n, offset = n == pool_n ? 1 : 0;
        Bytes src(n * ss);
        for (std::size_t i = 0; i < n; ++i) std::memcpy(&src[i * ss], &pool[((start + i) % pool_n) * ss], ss);
        DeviceBuffer dsrc((n + offset) * ss), ddst((n + offset + kGuard) * ds);
        upload(dsrc.at(offset * ss), src);
        upload(ddst.at(), Bytes((n + offset + kGuard) * ds, 0xff));
        cuda::cast(dsrc.at(offset * ss), from, ddst.at(offset * ds), to, n, 0);
        const Bytes got = download<std::uint8_t>(ddst.at(), (n + offset + kGuard) * ds);
        const Bytes want = cpu_convert(src, from, to);
        EXPECT_EQ(count_differences(Bytes(got.begin() + offset * ds, got.begin() + (offset + n) * ds), want, ds), 0u);
        std::size_t poisoned = 0;
        for (std::size_t i = 0; i < offset * ds; ++i) poisoned += got[i] == 0xff;
        for (std::size_t i = (offset + n) * ds; i < got.size(); ++i) poisoned += got[i] == 0xff;
        EXPECT_EQ(poisoned, (offset + kGuard) * ds) << "a write outside the output";
      }
    }
  }
}

TEST(CudaCast, InPlaceBetweenSameSizeTypes) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (auto [from, to] : {std::pair{DType::f16, DType::bf16}, std::pair{DType::f8_e4m3, DType::f8_e5m2},
                          std::pair{DType::f8_e5m2, DType::f8_e4m3}}) {
    SCOPED_TRACE(fmt::format("{} -> {} in place", dtype_name(from), dtype_name(to)));
    const Bytes src = source_pool(from);
    const std::size_t n = src.size() / dtype_size(from);
    DeviceBuffer buf(src.size());
    upload(buf.at(), src);
    cuda::cast(buf.at(), from, buf.at(), to, n, 0);
    EXPECT_EQ(count_differences(download<std::uint8_t>(buf.at(), src.size()), cpu_convert(src, from, to),
                                dtype_size(to)),
              0u);
  }
}

// ---- scaled FP8, per tensor ----

// Random f32 values of varied magnitude (so that after scaling some saturate and some are FP8
// subnormals), a few -0 and exact zeros; specials are optional.
std::vector<float> fp8_inputs(std::size_t n, std::uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> exp(-24, 12);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(mant(rng), exp(rng));
  if (n > 2) v[n / 2] = -0.f;
  if (n > 3) v[n / 3] = 0.f;
  if (specials && n > 7) {
    v[1] = INFINITY;
    v[n - 2] = -INFINITY;
    v[n / 5] = kNaN;
  }
  return v;
}

// The values stored as t (f32, bf16 or f16; rounded by the CPU rules), and the f32 values they hold.
Bytes as_source(const std::vector<float>& v, DType t, std::vector<float>& values) {
  Bytes out(v.size() * dtype_size(t));
  cpu::convert(v.data(), DType::f32, out.data(), t, v.size());
  values.resize(v.size());
  cpu::convert(out.data(), t, values.data(), DType::f32, v.size());
  return out;
}

// max |x| of the values, as the bit-pattern max the kernels compute (NaN when any is NaN).
float amax_of(const std::vector<float>& values, std::size_t begin = 0, std::size_t end = SIZE_MAX) {
  std::uint32_t m = 0;
  for (std::size_t i = begin; i < std::min(end, values.size()); ++i) m = std::max(m, bits(values[i]) & 0x7fffffffu);
  return std::bit_cast<float>(m);
}

// The rule: q = fp8(f32(x * scale)). The product of two floats is exact in f64, and rounding it to f32
// gives the IEEE f32 product, so the reference is computed in f64 and rounded where the kernel rounds.
std::uint8_t reference_quantize(float x, float scale, bool e4m3) {
  return fp8_code(static_cast<float>(double(x) * double(scale)), e4m3);
}

TEST(CudaFp8, QuantizeMatchesReferenceAndReportsAmax) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::size_t kGuard = 32;
  for (DType src_t : {DType::f32, DType::bf16}) {
    for (DType dst_t : {DType::f8_e4m3, DType::f8_e5m2}) {
      const bool e4m3 = dst_t == DType::f8_e4m3;
      for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{127}, std::size_t{1000}, std::size_t{4097},
                            std::size_t{100003}}) {
        for (int mode = 0; mode < 3; ++mode) {  // 0: scale by value, 1: by pointer, 2: by value, specials, no amax
          SCOPED_TRACE(fmt::format("{} -> {}, n = {}, mode {}", dtype_name(src_t), dtype_name(dst_t), n, mode));
          std::vector<float> values;
          const Bytes src = as_source(fp8_inputs(n, n + mode, mode == 2), src_t, values);
          // A scale that maps ~2^12 to a bit past the format's max, so the largest values saturate.
          const float scale = (e4m3 ? 448.f : 57344.f) / 3000.f;
          DeviceBuffer dsrc(src.size()), ddst(n + kGuard), dscalars(8);
          upload(dsrc.at(), src);
          upload(ddst.at(), Bytes(n + kGuard, 0xff));
          upload(dscalars.at(), std::vector<float>{scale, kNaN});
          float* damax = dscalars.at<float>(4);
          if (mode == 1) {
            cuda::quantize_fp8(dsrc.at(), src_t, dscalars.at<const float>(), ddst.at(), dst_t, n, damax, 0);
          } else {
            cuda::quantize_fp8(dsrc.at(), src_t, scale, ddst.at(), dst_t, n, mode == 2 ? nullptr : damax, 0);
          }
          const Bytes got = download<std::uint8_t>(ddst.at(), n + kGuard);
          std::size_t wrong = 0, poisoned = 0;
          for (std::size_t i = 0; i < n; ++i) wrong += got[i] != reference_quantize(values[i], scale, e4m3);
          for (std::size_t i = n; i < n + kGuard; ++i) poisoned += got[i] == 0xff;
          EXPECT_EQ(wrong, 0u);
          EXPECT_EQ(poisoned, kGuard);
          const float amax = download<float>(damax, 1)[0];
          if (mode == 2) {
            EXPECT_TRUE(std::isnan(amax)) << "amax was written although not asked for";
          } else {
            EXPECT_EQ(bits(amax), bits(amax_of(values)));
          }
        }
      }
    }
  }
}

TEST(CudaFp8, AmaxIsNaNWhenAnyElementIsAndZeroForNoElements) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  std::vector<float> values;
  const Bytes src = as_source(fp8_inputs(4097, 5, true), DType::f32, values);
  DeviceBuffer dsrc(src.size()), ddst(4097), damax(4);
  upload(dsrc.at(), src);
  cuda::quantize_fp8(dsrc.at(), DType::f32, 2.f, ddst.at(), DType::f8_e5m2, 4097, damax.at<float>(), 0);
  EXPECT_TRUE(std::isnan(download<float>(damax.at(), 1)[0]));
  upload(damax.at(), std::vector<float>{kNaN});
  cuda::quantize_fp8(dsrc.at(), DType::f32, 2.f, ddst.at(), DType::f8_e5m2, 0, damax.at<float>(), 0);
  EXPECT_EQ(download<float>(damax.at(), 1)[0], 0.f);
}

// dequantize: v = f32(fp8_value(q) * inv_scale), then to bf16 like a cast. Every code, several scales
// (tiny ones reach f32 subnormals, huge ones overflow bf16 and f32 to Inf).
TEST(CudaFp8, DequantizeMatchesReference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::size_t n = 256 * 5 + 3;
  Bytes codes(n);
  for (std::size_t i = 0; i < n; ++i) codes[i] = static_cast<std::uint8_t>(i * 7);
  for (DType src_t : {DType::f8_e4m3, DType::f8_e5m2}) {
    const bool e4m3 = src_t == DType::f8_e4m3;
    for (DType dst_t : {DType::f32, DType::bf16}) {
      for (float inv : {1.f, 1.f / 448.f, 3.3e-7f, 1e-40f, 2.5e35f, -0.75f}) {
        for (bool by_pointer : {false, true}) {
          SCOPED_TRACE(fmt::format("{} -> {}, inv_scale {}, by pointer {}", dtype_name(src_t), dtype_name(dst_t),
                                   inv, by_pointer));
          const std::size_t es = dtype_size(dst_t);
          DeviceBuffer dsrc(n), ddst((n + 8) * es), dinv(4);
          upload(dsrc.at(), codes);
          upload(ddst.at(), Bytes((n + 8) * es, 0xff));
          upload(dinv.at(), std::vector<float>{inv});
          if (by_pointer) {
            cuda::dequantize_fp8(dsrc.at(), src_t, dinv.at<const float>(), ddst.at(), dst_t, n, 0);
          } else {
            cuda::dequantize_fp8(dsrc.at(), src_t, inv, ddst.at(), dst_t, n, 0);
          }
          const Bytes got = download<std::uint8_t>(ddst.at(), (n + 8) * es);
          Bytes want;
          for (std::size_t i = 0; i < n; ++i) {
            const float v = static_cast<float>(double(fp8_value(codes[i], e4m3)) * double(inv));
            if (dst_t == DType::f32) append_bytes(want, v);
            else append_bytes(want, BFloat16::from_float(v).bits);
          }
          want.resize((n + 8) * es, 0xff);
          const std::size_t wrong = count_differences(got, want, es);
          EXPECT_EQ(wrong, 0u) << first_difference(got, want, es, codes);
        }
      }
    }
  }
}

// ---- blockwise FP8 ----

struct BlockwiseResult {
  Bytes codes;
  std::vector<float> inv_scales;
};

// float64 reference of the tile rule: amax (exact), scale = f32(fp8_max / amax), inv = f32(amax / fp8_max)
// (an f64 quotient rounded once to f32 is the IEEE f32 quotient: 53 >= 2 * 24 + 2), 1 and 1 when amax is
// 0 / Inf / NaN or the scale overflows; codes as in reference_quantize.
BlockwiseResult reference_blockwise(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
                                    std::int64_t tile_rows, bool e4m3) {
  const double fmax = e4m3 ? 448.0 : 57344.0;
  const std::int64_t srows = (rows + tile_rows - 1) / tile_rows, scols = (cols + 127) / 128;
  BlockwiseResult r{Bytes(x.size()), std::vector<float>(srows * scols)};
  for (std::int64_t tr = 0; tr < srows; ++tr) {
    for (std::int64_t tc = 0; tc < scols; ++tc) {
      const std::int64_t r0 = tr * tile_rows, r1 = std::min(rows, r0 + tile_rows);
      const std::int64_t c0 = tc * 128, c1 = std::min(cols, c0 + 128);
      std::uint32_t m = 0;
      for (std::int64_t i = r0; i < r1; ++i) {
        for (std::int64_t j = c0; j < c1; ++j) m = std::max(m, bits(x[i * cols + j]) & 0x7fffffffu);
      }
      const double amax = std::bit_cast<float>(m);
      float scale = 1.f, inv = 1.f;
      if (amax > 0 && std::isfinite(amax) && std::isfinite(static_cast<float>(fmax / amax))) {
        scale = static_cast<float>(fmax / amax);
        inv = static_cast<float>(amax / fmax);
      }
      r.inv_scales[tr * scols + tc] = inv;
      for (std::int64_t i = r0; i < r1; ++i) {
        for (std::int64_t j = c0; j < c1; ++j) r.codes[i * cols + j] = reference_quantize(x[i * cols + j], scale, e4m3);
      }
    }
  }
  return r;
}

// Rows of very different magnitudes (2^-30 .. 2^30), so tiles get different scales; an all-zero tile
// (scale 1) when there is room; optionally a NaN and an Inf in their own tiles.
std::vector<float> blockwise_inputs(std::int64_t rows, std::int64_t cols, std::uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> exp(-30, 30);
  std::vector<float> v(rows * cols);
  for (std::int64_t i = 0; i < rows; ++i) {
    const int e = exp(rng);
    for (std::int64_t j = 0; j < cols; ++j) v[i * cols + j] = std::ldexp(mant(rng), e);
  }
  if (rows >= 2 && cols > 128) {
    for (std::int64_t j = 0; j < 128; ++j) v[j] = v[cols + j] = 0.f;  // tile (0, 0) of 1x128; rows 0-1 of 128x128
    if (rows < 128) {
      for (std::int64_t i = 2; i < rows; ++i) std::fill_n(&v[i * cols], 128, 0.f);
    }
  }
  if (specials && cols > 256) {
    v[cols + 200] = kNaN;
    v[(rows - 1) * cols + cols - 1] = -INFINITY;
  }
  return v;
}

TEST(CudaFp8, BlockwiseMatchesReferenceAndRoundTrips) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  struct Shape {
    std::int64_t rows, cols;
  };
  const Shape shapes[] = {{1, 1}, {3, 127}, {2, 128}, {5, 129}, {128, 128}, {129, 257}, {200, 1000}, {1, 4097},
                          {130, 385}};
  for (auto tiling : {cuda::Fp8Tiling::row_1x128, cuda::Fp8Tiling::block_128x128}) {
    const std::int64_t tile_rows = cuda::fp8_tile_rows(tiling);
    for (DType src_t : {DType::f32, DType::bf16}) {
      for (DType dst_t : {DType::f8_e4m3, DType::f8_e5m2}) {
        const bool e4m3 = dst_t == DType::f8_e4m3;
        for (Shape s : shapes) {
          for (bool specials : {false, true}) {
            SCOPED_TRACE(fmt::format("tile rows {}, {} -> {}, ({}, {}), specials {}", tile_rows, dtype_name(src_t),
                                     dtype_name(dst_t), s.rows, s.cols, specials));
            const std::size_t n = s.rows * s.cols;
            const std::size_t ns = cuda::fp8_scale_rows(s.rows, tiling) * cuda::fp8_scale_cols(s.cols);
            std::vector<float> x;
            const Bytes src = as_source(blockwise_inputs(s.rows, s.cols, n + specials, specials), src_t, x);
            const BlockwiseResult want = reference_blockwise(x, s.rows, s.cols, tile_rows, e4m3);
            DeviceBuffer dsrc(src.size()), dq(n + 16), dinv((ns + 4) * 4), dback(n * 4 + 16);
            upload(dsrc.at(), src);
            upload(dq.at(), Bytes(n + 16, 0xff));
            upload(dinv.at(), std::vector<float>(ns + 4, kNaN));
            cuda::quantize_fp8_blockwise(dsrc.at(), src_t, dq.at(), dst_t, dinv.at<float>(), s.rows, s.cols, tiling,
                                         0);
            const Bytes q = download<std::uint8_t>(dq.at(), n + 16);
            const std::vector<float> inv = download<float>(dinv.at(), ns + 4);
            std::size_t wrong_codes = 0, wrong_scales = 0, poisoned = 0;
            for (std::size_t i = 0; i < n; ++i) wrong_codes += q[i] != want.codes[i];
            for (std::size_t i = 0; i < ns; ++i) wrong_scales += bits(inv[i]) != bits(want.inv_scales[i]);
            for (std::size_t i = n; i < n + 16; ++i) poisoned += q[i] == 0xff;
            for (std::size_t i = ns; i < ns + 4; ++i) poisoned += std::isnan(inv[i]);
            EXPECT_EQ(wrong_codes, 0u);
            EXPECT_EQ(wrong_scales, 0u);
            EXPECT_EQ(poisoned, 20u) << "a write outside the outputs";

            // Dequantize to f32: bit-exact against f32(fp8_value * inv), and within half an FP8 step of x
            // (relative 2^-(mant+1) for normals; absolute half the subnormal step, times inv, below).
            cuda::dequantize_fp8_blockwise(dq.at(), dst_t, dinv.at<const float>(), dback.at(), DType::f32, s.rows,
                                           s.cols, tiling, 0);
            const std::vector<float> back = download<float>(dback.at(), n);
            const std::int64_t scols = cuda::fp8_scale_cols(s.cols);
            std::size_t wrong_values = 0, too_far = 0;
            for (std::int64_t i = 0; i < s.rows; ++i) {
              for (std::int64_t j = 0; j < s.cols; ++j) {
                const std::size_t k = i * s.cols + j;
                const float t_inv = want.inv_scales[(i / tile_rows) * scols + j / 128];
                const float v = static_cast<float>(double(fp8_value(want.codes[k], e4m3)) * double(t_inv));
                if (bits(back[k]) != bits(v) && wrong_values++ == 0) {
                  ADD_FAILURE() << fmt::format("dequantized ({}, {}) code {:#04x}: got {:08x}, want {:08x}", i, j,
                                               want.codes[k], bits(back[k]), bits(v));
                }
                if (!std::isfinite(x[k]) || t_inv == 1.f) continue;  // unscaled tiles clip or lose range
                const double tol = std::max(std::ldexp(std::abs(double(x[k])), e4m3 ? -4 : -3),
                                            std::ldexp(double(t_inv), e4m3 ? -10 : -17)) * (1 + 1e-6);
                too_far += !(std::abs(double(back[k]) - x[k]) <= tol);
              }
            }
            EXPECT_EQ(wrong_values, 0u);
            EXPECT_EQ(too_far, 0u);
          }
        }
      }
    }
  }
}

// ---- reductions ----

std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

constexpr DType kReducible[] = {DType::f32, DType::bf16, DType::f16};
constexpr std::size_t kReduceSizes[] = {0, 1, 3, 127, 1000, 4097, 100003, (std::size_t{1} << 20) + 5};

TEST(CudaReduce, AmaxMatchesHost) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType t : kReducible) {
    for (std::size_t n : kReduceSizes) {
      for (int variant = 0; variant < 3; ++variant) {  // plain, a NaN, an Inf
        SCOPED_TRACE(fmt::format("{} n = {} variant {}", dtype_name(t), n, variant));
        std::vector<float> v = uniform(n, -100.f, 50.f, n + variant), values;
        if (n > 0) v[(n * 7) / 9] = variant == 1 ? kNaN : variant == 2 ? -INFINITY : -1000.f;
        const Bytes src = as_source(v, t, values);
        DeviceBuffer dsrc(src.size() + 2), dout(8);
        upload(dsrc.at(), src);
        upload(dout.at(), std::vector<float>{kNaN, kNaN});
        cuda::amax(dsrc.at(), t, n, dout.at<float>(), 0);
        const auto got = download<float>(dout.at(), 2);
        if (variant == 1 && n > 0) EXPECT_TRUE(std::isnan(got[0]));
        else EXPECT_EQ(bits(got[0]), bits(amax_of(values)));
        EXPECT_TRUE(std::isnan(got[1]));
      }
    }
  }
}

// The kernel adds in f64 and rounds once, so it is within half an f32 ulp of the exact sum plus the f64
// rounding (< n 2^-53 sum |x|); we allow rel 1e-5 of the sum plus 1e-9 sum |x| (for sums that cancel).
// Each sum runs twice and must give identical bits.
TEST(CudaReduce, SumMatchesFloat64AndIsDeterministic) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType t : kReducible) {
    for (std::size_t n : kReduceSizes) {
      SCOPED_TRACE(fmt::format("{} n = {}", dtype_name(t), n));
      std::vector<float> values;
      const Bytes src = as_source(uniform(n, -1.f, 3.f, n + 1), t, values);
      double ref = 0, abs_sum = 0;
      for (float x : values) {
        ref += x;
        abs_sum += std::abs(x);
      }
      DeviceBuffer dsrc(src.size() + 2), dout(8);
      upload(dsrc.at(), src);
      upload(dout.at(), std::vector<float>{kNaN, kNaN});
      cuda::sum(dsrc.at(), t, n, dout.at<float>(), 0);
      const float first = download<float>(dout.at(), 1)[0];
      cuda::sum(dsrc.at(), t, n, dout.at<float>(), 0);
      const auto got = download<float>(dout.at(), 2);
      EXPECT_LE(std::abs(double(first) - ref), 1e-5 * std::abs(ref) + 1e-9 * abs_sum) << first << " vs " << ref;
      EXPECT_EQ(bits(got[0]), bits(first)) << "two runs differ";
      EXPECT_TRUE(std::isnan(got[1]));
    }
  }
}

// Both kernels: a warp per row (cols < 4096) and a block per row. Same tolerance as the full sum.
TEST(CudaReduce, SumRowsMatchesFloat64AndIsDeterministic) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  struct Shape {
    std::int64_t rows, cols;
  };
  for (DType t : kReducible) {
    for (Shape s : {Shape{1, 1}, Shape{3, 127}, Shape{1000, 3}, Shape{65, 4095}, Shape{7, 4096}, Shape{5, 4097},
                    Shape{2, 100003}, Shape{3000, 33}, Shape{4, 0}}) {
      SCOPED_TRACE(fmt::format("{} ({}, {})", dtype_name(t), s.rows, s.cols));
      const std::size_t n = s.rows * s.cols;
      std::vector<float> values;
      const Bytes src = as_source(uniform(n, -2.f, 3.f, n + 2), t, values);
      DeviceBuffer dsrc(src.size() + 2), dout((s.rows + 4) * 4);
      upload(dsrc.at(), src);
      upload(dout.at(), std::vector<float>(s.rows + 4, kNaN));
      cuda::sum_rows(dsrc.at(), t, s.rows, s.cols, dout.at<float>(), 0);
      const auto first = download<float>(dout.at(), s.rows + 4);
      cuda::sum_rows(dsrc.at(), t, s.rows, s.cols, dout.at<float>(), 0);
      const auto second = download<float>(dout.at(), s.rows);
      std::size_t bad = 0, differ = 0, poisoned = 0;
      for (std::int64_t r = 0; r < s.rows; ++r) {
        double ref = 0, abs_sum = 0;
        for (std::int64_t c = 0; c < s.cols; ++c) {
          ref += values[r * s.cols + c];
          abs_sum += std::abs(values[r * s.cols + c]);
        }
        bad += !(std::abs(double(first[r]) - ref) <= 1e-5 * std::abs(ref) + 1e-9 * abs_sum);
        differ += bits(first[r]) != bits(second[r]);
      }
      for (std::int64_t r = s.rows; r < s.rows + 4; ++r) poisoned += std::isnan(first[r]);
      EXPECT_EQ(bad, 0u);
      EXPECT_EQ(differ, 0u) << "two runs differ";
      EXPECT_EQ(poisoned, 4u) << "a write past the last row";
    }
  }
}

// ---- more than 2^31 elements (64-bit indexing) ----

// One bf16 buffer of n = 2^31 + 2^20 + 3 ones with a few other values, some past index 2^31; every entry
// point runs over all of it, and the results are checked at the special values, at windows around 0,
// 2^31 and the end, and in total. About 6.5 GB of device memory; skipped when that is not available.
TEST(CudaLarge, EveryKernelHandlesMoreThan2To31Elements) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::size_t k31 = std::size_t{1} << 31;
  constexpr std::size_t n = k31 + (std::size_t{1} << 20) + 3;
  constexpr std::size_t kGuard = 64;
  std::map<std::size_t, float> specials = {{5, -3.5f},        {k31 - 2, 0.25f},  {k31 - 1, -600.f}, {k31, 2.5f},
                                           {k31 + 1, 0.001f}, {k31 + 130, -0.f}, {n - 2, 100.f},    {n - 1, 1000.f}};
  try {
    DeviceBuffer dsrc(n * 2), ddst(n + kGuard), dout(64 * 4);
    cuda::fill(dsrc.at(), DType::bf16, n, 1.0, 0);
    for (auto [i, v] : specials) upload(dsrc.at(i * 2), std::vector<std::uint16_t>{BFloat16::from_float(v).bits});
    auto value = [&](std::size_t i) {
      const auto it = specials.find(i);
      return it == specials.end() ? 1.f : bf16_value(BFloat16::from_float(it->second).bits);
    };
    const std::size_t windows[] = {0, k31 - 4096, k31 + 4096, n - 8192};  // starts of 8192-element windows
    auto check_codes = [&](auto&& code_at) {
      std::size_t wrong = 0;
      const Bytes tail = download<std::uint8_t>(ddst.at(n), kGuard);
      for (std::size_t w : windows) {
        const Bytes got = download<std::uint8_t>(ddst.at(w), 8192);
        for (std::size_t i = 0; i < 8192; ++i) wrong += got[i] != code_at(w + i);
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(std::count(tail.begin(), tail.end(), 0xab), std::ptrdiff_t(kGuard)) << "a write past the end";
    };

    // cast bf16 -> e4m3
    cuda::fill(ddst.at(), DType::u8, n + kGuard, 0xab, 0);
    cuda::cast(dsrc.at(), DType::bf16, ddst.at(), DType::f8_e4m3, n, 0);
    check_codes([&](std::size_t i) { return Float8E4M3::from_float(value(i)).bits; });

    // per-tensor quantize with amax
    cuda::fill(ddst.at(), DType::u8, n + kGuard, 0xab, 0);
    cuda::quantize_fp8(dsrc.at(), DType::bf16, 0.5f, ddst.at(), DType::f8_e5m2, n, dout.at<float>(), 0);
    check_codes([&](std::size_t i) { return reference_quantize(value(i), 0.5f, false); });
    EXPECT_EQ(download<float>(dout.at(), 1)[0], 1000.f);

    // amax, sum
    cuda::amax(dsrc.at(), DType::bf16, n, dout.at<float>(1 * 4), 0);
    cuda::sum(dsrc.at(), DType::bf16, n, dout.at<float>(2 * 4), 0);
    double total = double(n - specials.size());
    for (auto [i, v] : specials) total += value(i);
    const auto scalars = download<float>(dout.at(), 3);
    EXPECT_EQ(scalars[1], 1000.f);
    EXPECT_LE(std::abs(double(scalars[2]) - total), 1e-5 * total);

    // sum_rows, both kernels, with rows * cols > 2^31
    for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{65535, 32769}, {2147484, 1000}}) {
      SCOPED_TRACE(fmt::format("sum_rows ({}, {})", rows, cols));
      DeviceBuffer drows(rows * 4);
      cuda::sum_rows(dsrc.at(), DType::bf16, rows, cols, drows.at<float>(), 0);
      const auto got = download<float>(drows.at(), rows);
      std::vector<double> want(rows, double(cols));
      for (auto [i, v] : specials) {
        if (i < std::size_t(rows * cols)) want[i / cols] += value(i) - 1.0;
      }
      std::size_t bad = 0;
      for (std::int64_t r = 0; r < rows; ++r) bad += !(std::abs(got[r] - want[r]) <= 1e-5 * std::abs(want[r]));
      EXPECT_EQ(bad, 0u);
    }

    // blockwise over (2^24 + 1, 128): 2^31 + 128 elements
    constexpr std::int64_t rows = (std::int64_t{1} << 24) + 1, cols = 128;
    for (auto tiling : {cuda::Fp8Tiling::row_1x128, cuda::Fp8Tiling::block_128x128}) {
      SCOPED_TRACE(fmt::format("blockwise, tile rows {}", cuda::fp8_tile_rows(tiling)));
      const std::int64_t tile_rows = cuda::fp8_tile_rows(tiling), ns = cuda::fp8_scale_rows(rows, tiling);
      DeviceBuffer dinv(ns * 4);
      cuda::fill(ddst.at(), DType::u8, n + kGuard, 0xab, 0);
      cuda::quantize_fp8_blockwise(dsrc.at(), DType::bf16, ddst.at(), DType::f8_e4m3, dinv.at<float>(), rows, cols,
                                   tiling, 0);
      // Reference per tile: amax is 1 except in tiles holding a special value of larger magnitude.
      std::vector<float> amax(ns, 1.f);
      for (auto [i, v] : specials) {
        if (i < std::size_t(rows * cols)) amax[(i / cols) / tile_rows] = std::max(amax[(i / cols) / tile_rows],
                                                                                  std::abs(value(i)));
      }
      const auto inv = download<float>(dinv.at(), ns);
      std::size_t wrong_scales = 0;
      for (std::int64_t t = 0; t < ns; ++t) wrong_scales += bits(inv[t]) != bits(amax[t] / 448.f);
      EXPECT_EQ(wrong_scales, 0u);
      // Windows: the start, across 2^31, and the last row (which holds two specials) plus what follows it.
      const std::size_t end = rows * cols;
      std::size_t wrong = 0, written_past = 0;
      for (std::size_t w : {std::size_t{0}, k31 - 4096, end - 8192 + 128}) {
        const Bytes got = download<std::uint8_t>(ddst.at(w), 8192);
        for (std::size_t i = 0; i < 8192; ++i) {
          if (w + i >= end) {
            written_past += got[i] != 0xab;
            continue;
          }
          const float scale = 448.f / amax[((w + i) / cols) / tile_rows];
          wrong += got[i] != reference_quantize(value(w + i), scale, true);
        }
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(written_past, 0u) << "a write past the matrix";
    }
  } catch (const Error& e) {
    if (std::string(e.what()).find("cudaMalloc") == std::string::npos) throw;
    device_allocator().empty_cache();
    GTEST_SKIP() << "not enough device memory: " << e.what();
  }
  device_allocator().empty_cache();
}

}  // namespace
}  // namespace memtrain
