// CUDA backend (include/memtrain/cuda/cuda.h) against references computed here on the host: fill, add,
// mul, copy, gemm, and the device allocator's accounting. Every device test skips with
// cuda::unavailable_reason() when no usable device exists; CudaAvailability runs everywhere.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"

#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using test_support::device_allocator;
using test_support::DeviceBuffer;
using test_support::download;
using test_support::upload;


// ---- narrow floats, decoded and generated from their bit fields (independent of the library) ----

struct Format {
  int mant_bits;  // stored mantissa bits
  int min_exp;    // exponent of the smallest normal number
};
constexpr Format kF16{10, -14};
constexpr Format kBF16{7, -126};

double decode_bf16(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

double decode_f16(std::uint16_t bits) {
  const int exp = (bits >> 10) & 0x1f;
  const int mant = bits & 0x3ff;
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Spacing of the format's numbers around x (subnormal spacing below the normal range).
double ulp(double x, Format f) {
  const int e = x == 0.0 ? f.min_exp : std::max(std::ilogb(x), f.min_exp);
  return std::ldexp(1.0, e - f.mant_bits);
}

// Random finite values: random sign and mantissa, exponent field uniform in [exp_lo, exp_hi].
std::vector<std::uint16_t> random_bits(std::size_t n, int mant_bits, int exp_lo, int exp_hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> exp(exp_lo, exp_hi);
  std::uniform_int_distribution<int> mant(0, (1 << mant_bits) - 1);
  std::vector<std::uint16_t> out(n);
  for (auto& v : out) {
    v = static_cast<std::uint16_t>(((rng() & 1) << 15) | (exp(rng) << mant_bits) | mant(rng));
  }
  return out;
}

std::vector<float> random_floats(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (auto& v : out) v = dist(rng);
  return out;
}

// ---- availability: runs with or without a device ----

TEST(CudaAvailability, ReportsWhyWhenNoDevice) {
#ifdef MEMTRAIN_HAVE_CUDA
  EXPECT_TRUE(cuda::built_with_cuda());
#else
  EXPECT_FALSE(cuda::built_with_cuda());
#endif
  if (cuda::is_available()) {
    EXPECT_GT(cuda::device_count(), 0);
    EXPECT_EQ(cuda::unavailable_reason(), "");
    return;
  }
  const std::string reason = cuda::unavailable_reason();
  EXPECT_FALSE(reason.empty());
  EXPECT_EQ(cuda::device_count(), 0);
  float host[4] = {};
  try {
    cuda::fill(host, DType::f32, 4, 1.0, 0);
    ADD_FAILURE() << "cuda::fill without a device did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("cuda::fill: ", 0), 0u) << what;
    EXPECT_NE(what.find(reason), std::string::npos) << what;
  }
  EXPECT_THROW(cuda::gemm(DType::f32, false, false, 2, 2, 2, 1.f, host, 2, host, 2, 0.f, host, 2, 0), Error);
  // No CUDA memory either: without CUDA there is no source; with CUDA the source cannot allocate.
  EXPECT_THROW(device_allocator().allocate(64), Error);
}

// ---- fill ----

struct FillCase {
  DType dtype;
  double value;
  std::uint64_t expected;  // bit pattern, worked out by hand from the format
};

TEST(CudaFill, EveryDTypeWritesTheValueAndNothingElse) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const FillCase cases[] = {
      {DType::f64, 1.5, std::bit_cast<std::uint64_t>(1.5)},
      {DType::f32, -2.25, std::bit_cast<std::uint32_t>(-2.25f)},
      {DType::f16, 1.5, 0x3e00},      // 0 01111 1000000000
      {DType::f16, -0.375, 0xb600},   // 1 01101 1000000000
      {DType::bf16, 1.5, 0x3fc0},     // top half of 0x3fc00000
      {DType::bf16, -0.375, 0xbec0},  // top half of 0xbec00000
      {DType::f8_e4m3, 1.5, 0x3c},    // 0 0111 100
      {DType::f8_e5m2, 1.5, 0x3e},    // 0 01111 10
      {DType::i32, -7, 0xfffffff9u},
      {DType::i64, 123456789012.0, 123456789012ull},
      {DType::u8, 200, 200},
      {DType::i8, -3, 0xfd},
      {DType::boolean, 2.0, 1},
  };
  constexpr std::size_t n = 1003;  // not a multiple of any vector width
  constexpr std::uint8_t kSentinel = 0xab;
  for (const FillCase& c : cases) {
    const std::size_t es = dtype_size(c.dtype);
    for (std::size_t first : {std::size_t{0}, std::size_t{1}}) {  // 16-byte aligned, then not (scalar path)
      SCOPED_TRACE(fmt::format("{} = {}, starting at element {}", dtype_name(c.dtype), c.value, first));
      const std::size_t total = n + 2;
      DeviceBuffer buf(total * es);
      upload(buf.at(), std::vector<std::uint8_t>(total * es, kSentinel));
      cuda::fill(buf.at(first * es), c.dtype, n, c.value, 0);
      const auto bytes = download<std::uint8_t>(buf.at(), total * es);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < total; ++i) {
        const bool inside = i >= first && i < first + n;
        for (std::size_t j = 0; j < es; ++j) {
          const auto want = inside ? static_cast<std::uint8_t>(c.expected >> (8 * j)) : kSentinel;
          wrong += bytes[i * es + j] != want;
        }
      }
      EXPECT_EQ(wrong, 0u);
    }
  }
}

// ---- add / mul ----

enum class Op { add, mul };
void run(Op op, const void* a, const void* b, void* out, DType dtype, std::size_t n) {
  if (op == Op::add) cuda::add(a, b, out, dtype, n, 0);
  else cuda::mul(a, b, out, dtype, n, 0);
}

// f32: exact. The kernel does one IEEE f32 operation; the reference does it in f64 (products of two
// floats are exact there, and rounding an f64 sum to f32 equals the correctly rounded f32 sum since
// 53 >= 2 * 24 + 2), then rounds once to f32. Same value, bit for bit.
TEST(CudaElementwise, F32AddMulAreExact) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::size_t n = 100003;
  const auto a = random_floats(n, -8.f, 8.f, 1);
  const auto b = random_floats(n, -8.f, 8.f, 2);
  for (Op op : {Op::add, Op::mul}) {
    for (std::size_t first : {std::size_t{0}, std::size_t{1}}) {  // vectorized, then scalar path
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(fmt::format("{} first={} in_place={}", op == Op::add ? "add" : "mul", first, in_place));
        const std::size_t m = n - first;
        DeviceBuffer da(n * 4), db(n * 4), dout(n * 4);
        upload(da.at(), a);
        upload(db.at(), b);
        float* out = in_place ? da.at<float>(first * 4) : dout.at<float>(first * 4);
        run(op, da.at(first * 4), db.at(first * 4), out, DType::f32, m);
        const auto got = download<float>(out, m);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < m; ++i) {
          const double x = a[first + i], y = b[first + i];
          const float want = static_cast<float>(op == Op::add ? x + y : x * y);
          wrong += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want);
        }
        EXPECT_EQ(wrong, 0u);
      }
    }
  }
}

// f16 / bf16: within 1 ulp of the exact result. The kernel widens to f32, does one f32 operation and
// rounds to the narrow type: half an ulp if the f32 step is exact (always for mul; for add unless the
// exponents are far apart) and, by the double-rounding theorem (24 >= 2 * 11 + 2), still correctly
// rounded otherwise. We allow 1 ulp so the test does not lean on that theorem; a wrong conversion,
// lane or element is off by far more.
void check_narrow(DType dtype, Op op) {
  const bool half = dtype == DType::f16;
  const Format format = half ? kF16 : kBF16;
  auto decode = half ? decode_f16 : decode_bf16;
  constexpr std::size_t n = 100003;
  // Exponent fields: f16 2^-8 <= |x| < 2^7 (products stay below 65504 and reach the subnormal range);
  // bf16 2^-7 <= |x| < 2^8.
  const int lo = half ? 7 : 120, hi = half ? 21 : 134;
  const auto a = random_bits(n, format.mant_bits, lo, hi, 3);
  const auto b = random_bits(n, format.mant_bits, lo, hi, 4);
  for (std::size_t first : {std::size_t{0}, std::size_t{1}}) {
    SCOPED_TRACE(fmt::format("{} {} first={}", dtype_name(dtype), op == Op::add ? "add" : "mul", first));
    const std::size_t m = n - first;
    DeviceBuffer da(n * 2), db(n * 2), dout(n * 2);
    upload(da.at(), a);
    upload(db.at(), b);
    run(op, da.at(first * 2), db.at(first * 2), dout.at(first * 2), dtype, m);
    const auto got = download<std::uint16_t>(dout.at(first * 2), m);
    double worst = 0;  // in ulps
    for (std::size_t i = 0; i < m; ++i) {
      const double x = decode(a[first + i]), y = decode(b[first + i]);
      const double exact = op == Op::add ? x + y : x * y;  // exact in f64 for these formats
      worst = std::max(worst, std::abs(decode(got[i]) - exact) / ulp(exact, format));
    }
    EXPECT_LE(worst, 1.0);
  }
}

TEST(CudaElementwise, F16AddMulWithinOneUlp) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  check_narrow(DType::f16, Op::add);
  check_narrow(DType::f16, Op::mul);
}

TEST(CudaElementwise, BF16AddMulWithinOneUlp) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  check_narrow(DType::bf16, Op::add);
  check_narrow(DType::bf16, Op::mul);
}

TEST(CudaElementwise, RejectsUnsupportedDType) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  DeviceBuffer buf(64);
  EXPECT_THROW(cuda::add(buf.at(), buf.at(), buf.at(), DType::i32, 4, 0), Error);
  EXPECT_THROW(cuda::mul(buf.at(), buf.at(), buf.at(), DType::f64, 4, 0), Error);
}

// ---- copy ----

TEST(CudaCopy, RoundTripsThroughEveryDirection) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  constexpr std::size_t n = 4099;
  std::vector<std::uint8_t> src(n);
  std::mt19937 rng(5);
  for (auto& v : src) v = static_cast<std::uint8_t>(rng());
  DeviceBuffer d1(n), d2(n);
  cuda::copy(d1.at(), Device::cuda(0), src.data(), Device::cpu(), n);     // host -> device
  cuda::copy(d2.at(), Device::cuda(0), d1.at(), Device::cuda(0), n);      // device -> device
  std::vector<std::uint8_t> back(n, 0), host_copy(n, 0);
  cuda::copy(back.data(), Device::cpu(), d2.at(), Device::cuda(0), n);    // device -> host
  cuda::copy(host_copy.data(), Device::cpu(), back.data(), Device::cpu(), n);  // host -> host
  EXPECT_EQ(back, src);
  EXPECT_EQ(host_copy, src);
  EXPECT_NO_THROW(cuda::synchronize(0));
  EXPECT_THROW(cuda::copy(back.data(), Device::cpu(), d2.at(), Device::cuda(cuda::device_count()), n), Error);
}

// ---- gemm ----

struct GemmShape {
  std::int64_t m, n, k;
};

// Row-major C = alpha op(A) op(B) + beta C in f64 on the host. Returns the reference and, per element,
// S = |alpha| sum_p |op(A)_ip op(B)_pj| + |beta C_ij|, the scale the rounding-error bound is relative to.
void reference_gemm(bool ta, bool tb, GemmShape s, double alpha, const std::vector<double>& a, std::int64_t lda,
                    const std::vector<double>& b, std::int64_t ldb, double beta, const std::vector<double>& c,
                    std::int64_t ldc, std::vector<double>& ref, std::vector<double>& scale) {
  ref.assign(static_cast<std::size_t>(s.m * s.n), 0.0);
  scale.assign(ref.size(), 0.0);
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = 0; j < s.n; ++j) {
      double sum = 0, abs_sum = 0;
      for (std::int64_t p = 0; p < s.k; ++p) {
        const double x = ta ? a[p * lda + i] : a[i * lda + p];
        const double y = tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        abs_sum += std::abs(x * y);
      }
      const double cij = c[i * ldc + j];
      ref[i * s.n + j] = alpha * sum + beta * cij;
      scale[i * s.n + j] = std::abs(alpha) * abs_sum + std::abs(beta * cij);
    }
  }
}

// Tolerances. f32: cuBLAS with CUBLAS_COMPUTE_32F (no TF32) sums k products in f32; the worst-case
// bound for any summation order is about k * 2^-24 * S, and we allow twice that. bf16: the inputs are
// exact bf16 values (so the reference sees what the GPU sees), products and sums are f32 (same bound),
// and the result is rounded once to bf16: half a bf16 ulp, allowed a full ulp. A wrong transpose or
// stride gives errors of order S, far above either bound.
void check_gemm(DType dtype, bool ta, bool tb, GemmShape s, float alpha, float beta) {
  SCOPED_TRACE(fmt::format("{} ta={} tb={} m={} n={} k={}", dtype_name(dtype), ta, tb, s.m, s.n, s.k));
  const bool bf16 = dtype == DType::bf16;
  const std::size_t es = dtype_size(dtype);
  // Stored shapes (row-major), each row padded by 3 elements to exercise the leading dimensions.
  const std::int64_t a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k;
  const std::int64_t b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n;
  const std::int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = s.n + 3;
  const std::size_t na = a_rows * lda, nb = b_rows * ldb, nc = s.m * ldc;

  std::vector<double> a(na), b(nb), c(nc);
  DeviceBuffer da(na * es), db(nb * es), dc(nc * es);
  std::uint64_t seed = 10 + 4 * ta + 2 * tb + s.k;
  auto make = [&](std::vector<double>& host, void* dev) {
    if (bf16) {
      const auto bits = random_bits(host.size(), 7, 124, 128, seed++);  // |x| in [2^-3, 4)
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = decode_bf16(bits[i]);
      upload(dev, bits);
    } else {
      const auto f = random_floats(host.size(), -2.f, 2.f, seed++);
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = f[i];
      upload(dev, f);
    }
  };
  make(a, da.at());
  make(b, db.at());
  make(c, dc.at());

  cuda::gemm(dtype, ta, tb, s.m, s.n, s.k, alpha, da.at(), lda, db.at(), ldb, beta, dc.at(), ldc, 0);

  std::vector<double> ref, scale;
  reference_gemm(ta, tb, s, alpha, a, lda, b, ldb, beta, c, ldc, ref, scale);
  std::vector<double> got(nc);
  if (bf16) {
    const auto bits = download<std::uint16_t>(dc.at(), nc);
    for (std::size_t i = 0; i < nc; ++i) got[i] = decode_bf16(bits[i]);
  } else {
    const auto f = download<float>(dc.at(), nc);
    for (std::size_t i = 0; i < nc; ++i) got[i] = f[i];
  }
  const double u32 = std::ldexp(1.0, -24);
  std::size_t bad = 0, padding_changed = 0;
  double worst = 0;  // error / tolerance
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const double g = got[i * ldc + j];
      if (j >= s.n) {  // the padding of C must be untouched
        padding_changed += g != c[i * ldc + j];
        continue;
      }
      const double r = ref[i * s.n + j];
      const double tol = 2.0 * s.k * u32 * scale[i * s.n + j] + (bf16 ? ulp(r, kBF16) : 0.0) + 1e-30;
      const double err = std::abs(g - r);
      worst = std::max(worst, err / tol);
      bad += !(err <= tol);
    }
  }
  EXPECT_EQ(bad, 0u) << "worst error / tolerance = " << worst;
  EXPECT_EQ(padding_changed, 0u);
}

TEST(CudaGemm, F32AllTransposesMatchF64Reference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (GemmShape s : {GemmShape{37, 29, 53}, GemmShape{16, 24, 2048}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) check_gemm(DType::f32, ta, tb, s, 0.75f, -0.5f);
    }
  }
}

TEST(CudaGemm, BF16AllTransposesMatchF64Reference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (GemmShape s : {GemmShape{37, 29, 53}, GemmShape{16, 24, 2048}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) check_gemm(DType::bf16, ta, tb, s, 0.75f, -0.5f);
    }
  }
}

TEST(CudaGemm, BetaZeroDoesNotReadC) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  // A = ones[2,3], B = ones[3,2]: every entry of A B is 3. C starts as NaN, which beta * C would keep.
  DeviceBuffer da(6 * 4), db(6 * 4), dc(4 * 4);
  upload(da.at(), std::vector<float>(6, 1.f));
  upload(db.at(), std::vector<float>(6, 1.f));
  upload(dc.at(), std::vector<float>(4, std::numeric_limits<float>::quiet_NaN()));
  cuda::gemm(DType::f32, false, false, 2, 2, 3, 1.f, da.at(), 3, db.at(), 2, 0.f, dc.at(), 2, 0);
  EXPECT_EQ(download<float>(dc.at(), 4), std::vector<float>(4, 3.f));
}

TEST(CudaGemm, RejectsBadArguments) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  DeviceBuffer buf(1024);
  void* p = buf.at();
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  // A is [4, 8] row-major: lda must be at least 8.
  EXPECT_NE(message([&] { cuda::gemm(DType::f32, false, false, 4, 4, 8, 1.f, p, 7, p, 4, 0.f, p, 4, 0); })
                .find("lda=7"),
            std::string::npos);
  EXPECT_NE(message([&] { cuda::gemm(DType::f16, false, false, 2, 2, 2, 1.f, p, 2, p, 2, 0.f, p, 2, 0); })
                .find("dtype f16"),
            std::string::npos);
  EXPECT_NE(message([&] { cuda::gemm(DType::f32, false, false, 2, 2, 2, 1.f, p, 2, p, 2, 0.f, p, 2, 99); })
                .find("device index 99"),
            std::string::npos);
}

// ---- device allocator ----

TEST(CudaAllocator, CountsLiveBytesByCategoryAndReusesTheCache) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Allocator& alloc = device_allocator();
  alloc.empty_cache();
  const MemoryStats before = alloc.stats();
  auto live = [&](MemoryCategory c) { return alloc.stats()[c].live_bytes; };

  const Block p = alloc.allocate(1000, MemoryCategory::parameters);
  const Block g = alloc.allocate(5000, MemoryCategory::gradients);
  EXPECT_EQ(live(MemoryCategory::parameters), before[MemoryCategory::parameters].live_bytes + 1000);
  EXPECT_EQ(live(MemoryCategory::gradients), before[MemoryCategory::gradients].live_bytes + 5000);
  EXPECT_EQ(alloc.stats().live_bytes, before.live_bytes + 6000);
  // Both blocks are carved from one 2 MiB segment (or from free space in one already held); the bytes in
  // use (reserved - cached) grow by exactly their two blocks.
  auto in_use = [](const MemoryStats& s) { return s.reserved_bytes - s.cached_bytes; };
  EXPECT_LE(alloc.stats().reserved_bytes - before.reserved_bytes, std::size_t{2} << 20);
  EXPECT_EQ(in_use(alloc.stats()), in_use(before) + p.class_bytes + g.class_bytes);
  EXPECT_GE(p.class_bytes, 1000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.ptr) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g.ptr) % 256, 0u);

  // The memory is real device memory: fill it on the device, read it back.
  cuda::fill(p.ptr, DType::u8, 1000, 7, 0);
  EXPECT_EQ(download<std::uint8_t>(p.ptr, 1000), std::vector<std::uint8_t>(1000, 7));

  alloc.deallocate(p);
  EXPECT_EQ(live(MemoryCategory::parameters), before[MemoryCategory::parameters].live_bytes);
  EXPECT_EQ(in_use(alloc.stats()), in_use(before) + g.class_bytes);

  // Same size again: served from the cache, same pointer, no new device memory; counted as activations.
  const MemoryStats mid = alloc.stats();
  const Block p2 = alloc.allocate(1000, MemoryCategory::activations);
  EXPECT_EQ(p2.ptr, p.ptr);
  EXPECT_EQ(alloc.stats().cache_hits, mid.cache_hits + 1);
  EXPECT_EQ(alloc.stats().reserved_bytes, mid.reserved_bytes);
  EXPECT_EQ(live(MemoryCategory::activations), before[MemoryCategory::activations].live_bytes + 1000);

  alloc.deallocate(p2);
  alloc.deallocate(g);
  alloc.empty_cache();
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes);
}

TEST(CudaAllocator, OutOfDeviceMemoryIsAnErrorAndRecoverable) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Allocator& alloc = device_allocator();
  const MemoryStats before = alloc.stats();
  try {
    alloc.allocate(std::size_t{1} << 50);  // 1 PiB
    ADD_FAILURE() << "allocating 1 PiB did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc.stats().live_bytes, before.live_bytes);
  DeviceBuffer ok(4096);  // the failure was not sticky
  cuda::fill(ok.at(), DType::f32, 1024, 2.0, 0);
  EXPECT_EQ(download<float>(ok.at(), 1024), std::vector<float>(1024, 2.f));
}

}  // namespace
}  // namespace memtrain
