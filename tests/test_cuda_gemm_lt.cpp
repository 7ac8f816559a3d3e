// cuda::gemm_lt (src/cuda/gemm_lt.h) against a float64 host reference. Inputs are drawn
// already rounded to their dtype (random bit fields for bf16/f16/fp8), so the reference sees exactly the
// values the GPU sees and every difference is the GPU's rounding. Outputs start as 0xFF bytes (NaN in
// f32, bf16 and f16): padding columns and the gaps between batches must still hold them afterwards, and
// with beta == 0 the whole of C is NaN, so a C that is read shows up. Device tests skip without a device;
// the argument checks run without one (they throw before the device is looked at).
//
// Tolerances, per element, relative to S = |alpha sa sb| sum_p |a_ip b_pj| + |beta c_ij| + |bias_j| (the
// scale any summation order's rounding error is bounded by), plus one ulp of the output type:
//   f32 (no TF32), and f16/bf16 inputs (their products are exact in f32): 2 k 2^-24 S, the worst-case
//     bound of f32 summation in any order, twice;
//   TF32: 2^-9 S more (each f32 input rounded to TF32's 11 significant bits: 2^-10 relative per product
//     when rounding by truncation; twice that);
//   fp8: 1e-2 S (products are exact, but Hopper's fp8 tensor cores accumulate with fewer bits than f32
//     between cuBLASLt's promotions to f32);
//   GELU epilogues: the error above times 1.2 (GELU's slope stays below 1.13) plus 2^-10 |z| (z the
//     pre-activation), room for a hardware tanh approximation (relative error 2^-11).
//   any epilogue: one more output rounding of a value <= S (cuBLASLt may round alpha*AB + beta*C to the
//     output type before the bias and GELU; seen on an H200 for bf16 and f16 outputs);
// and normwise, ||got - ref||_2 / ||ref||_2 over at least 64 elements: 1e-5 for f32 outputs of
// f32/bf16/f16 inputs, 2e-3 for TF32, 1e-2 for bf16/f16 outputs and for fp8 inputs, at least 2e-3 with
// GELU. A wrong transpose, stride, bias or epilogue gives errors of order S.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"
#include "cuda/gemm_lt.h"

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

using test_support::DeviceBuffer;

using cuda::GemmEpilogue;
using cuda::GemmLtArgs;

// Byte copies (the test builds every operand as raw bytes of its dtype).
void upload(void* dst, const std::vector<std::uint8_t>& host) {
  cuda::copy(dst, Device::cuda(0), host.data(), Device::cpu(), host.size());
}
std::vector<std::uint8_t> download(const void* src, std::size_t nbytes) {
  std::vector<std::uint8_t> host(nbytes);
  cuda::copy(host.data(), Device::cpu(), src, Device::cuda(0), nbytes);
  return host;
}

// ---- the number formats, decoded from their bit fields (independent of the library) ----

double decode_bf16(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

double decode_f16(std::uint16_t bits) {
  const int exp = (bits >> 10) & 0x1f, mant = bits & 0x3ff;
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

double decode_e4m3(std::uint8_t bits) {  // E4M3 "fn": no infinities, S.1111.111 is NaN
  const int exp = (bits >> 3) & 0xf, mant = bits & 0x7;
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  if (exp == 15 && mant == 7) return std::numeric_limits<double>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(mant, -9);
  return sign * std::ldexp(8 + mant, exp - 10);
}

double decode_e5m2(std::uint8_t bits) {
  const int exp = (bits >> 2) & 0x1f, mant = bits & 0x3;
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -16);
  return sign * std::ldexp(4 + mant, exp - 17);
}

// Spacing of an output format's numbers around x (subnormal spacing below the normal range).
double ulp(double x, DType t) {
  const int mant_bits = t == DType::f32 ? 23 : t == DType::bf16 ? 7 : 10;
  const int min_exp = t == DType::f16 ? -14 : -126;
  const int e = x == 0.0 ? min_exp : std::max(std::ilogb(x), min_exp);
  return std::ldexp(1.0, e - mant_bits);
}

// n values of dtype t with their bytes. Magnitudes: f32 uniform in [-2, 2]; the narrow types random
// sign and mantissa with |x| in [2^-3, 4) (f16, bf16) or [2^-3, 8) (fp8), so k = 300 sums stay far
// from f16's range and no value is zero.
struct Values {
  std::vector<double> value;
  std::vector<std::uint8_t> bytes;
};

Values random_values(DType t, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Values v;
  v.value.resize(n);
  v.bytes.resize(n * dtype_size(t));
  auto bits = [&](int lo, int hi, int mant_bits, int exp_shift, int sign_shift) -> std::uint32_t {
    const auto exp = std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng);
    const auto mant = std::uniform_int_distribution<std::uint32_t>(0, (1u << mant_bits) - 1)(rng);
    return ((rng() & 1) << sign_shift) | (exp << exp_shift) | mant;
  };
  for (std::size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::f32: {
        const float f = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
        v.value[i] = f;
        std::memcpy(&v.bytes[4 * i], &f, 4);
        break;
      }
      case DType::bf16: {
        const auto b = static_cast<std::uint16_t>(bits(124, 128, 7, 7, 15));
        v.value[i] = decode_bf16(b);
        std::memcpy(&v.bytes[2 * i], &b, 2);
        break;
      }
      case DType::f16: {
        const auto b = static_cast<std::uint16_t>(bits(12, 16, 10, 10, 15));
        v.value[i] = decode_f16(b);
        std::memcpy(&v.bytes[2 * i], &b, 2);
        break;
      }
      case DType::f8_e4m3: {
        const auto b = static_cast<std::uint8_t>(bits(4, 9, 3, 3, 7));
        v.value[i] = decode_e4m3(b);
        v.bytes[i] = b;
        break;
      }
      case DType::f8_e5m2: {
        const auto b = static_cast<std::uint8_t>(bits(12, 17, 2, 2, 7));
        v.value[i] = decode_e5m2(b);
        v.bytes[i] = b;
        break;
      }
      default:
        ADD_FAILURE() << "no generator for " << dtype_name(t);
        return v;
    }
  }
  return v;
}

double decode_output(const std::uint8_t* p, DType t) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t b;
  std::memcpy(&b, p, 2);
  return t == DType::bf16 ? decode_bf16(b) : decode_f16(b);
}

double gelu_tanh(double z) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * z * (1.0 + std::tanh(c * (z + 0.044715 * z * z * z)));
}

// ---- one checked GEMM ----

struct Combo {
  DType a, b, c;
  bool tf32 = false;
};

bool is_f8(DType t) { return t == DType::f8_e4m3 || t == DType::f8_e5m2; }
bool has_bias(GemmEpilogue e) { return e == GemmEpilogue::bias || e == GemmEpilogue::bias_gelu; }
bool has_gelu(GemmEpilogue e) { return e == GemmEpilogue::gelu || e == GemmEpilogue::bias_gelu; }

struct Case {
  Combo combo;
  bool ta = false, tb = false;
  std::int64_t m = 1, n = 1, k = 1;
  GemmEpilogue epilogue = GemmEpilogue::none;
  float alpha = 1.f, beta = 0.f;
  std::int64_t batch = 1;
  bool broadcast_b = false;  // stride_b = 0: every batch uses the same B
  std::size_t misalign = 0;  // start a, b, c this many elements past a 256-byte boundary
};

std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

std::string describe(const Case& c) {
  return fmt::format("{} x {} -> {}{} ta={} tb={} m={} n={} k={} epilogue={} alpha={} beta={} batch={}{}{}",
                     dtype_name(c.combo.a), dtype_name(c.combo.b), dtype_name(c.combo.c),
                     c.combo.tf32 ? " (tf32)" : "", c.ta, c.tb, c.m, c.n, c.k, static_cast<int>(c.epilogue), c.alpha,
                     c.beta, c.batch, c.broadcast_b ? " broadcast B" : "",
                     c.misalign ? fmt::format(" misaligned by {}", c.misalign) : "");
}

void check_case(const Case& cs, std::uint64_t seed) {
  SCOPED_TRACE(describe(cs));
  const Combo& co = cs.combo;
  const bool f8 = is_f8(co.a);
  const std::size_t ea = dtype_size(co.a), eb = dtype_size(co.b), ec = dtype_size(co.c);
  // Stored shapes (row-major), each row padded; fp8 leading dimensions and strides in 16-byte multiples.
  const std::int64_t a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
  const std::int64_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
  const std::int64_t lda = f8 ? round_up(a_cols + 1, 16) : a_cols + 3;
  const std::int64_t ldb = f8 ? round_up(b_cols + 1, 16) : b_cols + 2;
  const std::int64_t ldc = f8 ? round_up(cs.n + 1, 16 / static_cast<std::int64_t>(ec)) : cs.n + 3;
  const std::int64_t gap = f8 ? 16 : 5;  // elements between batches
  const std::int64_t stride_a = a_rows * lda + gap;
  const std::int64_t stride_b = cs.broadcast_b ? 0 : b_rows * ldb + gap;
  const std::int64_t stride_c = round_up(cs.m * ldc + gap, f8 ? 16 / static_cast<std::int64_t>(ec) : 1);
  const std::int64_t na = (cs.batch - 1) * stride_a + a_rows * lda;
  const std::int64_t nb = (cs.batch - 1) * stride_b + b_rows * ldb;
  const std::int64_t nc = (cs.batch - 1) * stride_c + cs.m * ldc;

  const Values a = random_values(co.a, na, seed);
  const Values b = random_values(co.b, nb, seed + 1);
  const Values bias = random_values(co.c, cs.n, seed + 2);
  // C: random where beta reads it; everything else (padding, gaps, and all of C when beta == 0) is 0xFF.
  Values c = random_values(co.c, nc, seed + 3);
  for (std::int64_t i = 0; i < nc; ++i) {
    const std::int64_t in_batch = i % stride_c, col = in_batch % ldc;
    const bool live = in_batch < cs.m * ldc && col < cs.n;
    if (!live || cs.beta == 0.f) {
      std::fill_n(&c.bytes[i * ec], ec, std::uint8_t{0xff});
      c.value[i] = 0.0;  // beta == 0: C does not take part
    }
  }
  const float a_scale = 0.75f, b_scale = 1.25f;

  const std::size_t off_a = cs.misalign * ea, off_b = cs.misalign * eb, off_c = cs.misalign * ec;
  DeviceBuffer da(off_a + na * ea), db(off_b + nb * eb), dc(off_c + nc * ec), dbias(cs.n * ec), dscale(512);
  upload(da.at(off_a), a.bytes);
  upload(db.at(off_b), b.bytes);
  upload(dc.at(off_c), c.bytes);
  upload(dbias.at(), bias.bytes);
  std::vector<std::uint8_t> scales(512);  // a_scale at byte 0, b_scale at byte 256: aligned like cudaMalloc
  std::memcpy(&scales[0], &a_scale, 4);
  std::memcpy(&scales[256], &b_scale, 4);
  upload(dscale.at(), scales);

  GemmLtArgs g;
  g.a_type = co.a;
  g.b_type = co.b;
  g.c_type = co.c;
  g.allow_tf32 = co.tf32;
  g.trans_a = cs.ta;
  g.trans_b = cs.tb;
  g.m = cs.m;
  g.n = cs.n;
  g.k = cs.k;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.batch = cs.batch;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_c = stride_c;
  g.alpha = cs.alpha;
  g.beta = cs.beta;
  g.epilogue = cs.epilogue;
  g.bias = has_bias(cs.epilogue) ? dbias.at() : nullptr;
  if (f8) {
    g.a_scale = reinterpret_cast<const float*>(dscale.at(0));
    g.b_scale = reinterpret_cast<const float*>(dscale.at(256));
  }
  try {
    cuda::gemm_lt(g, da.at(off_a), db.at(off_b), dc.at(off_c), 0);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    return;
  }
  const std::vector<std::uint8_t> got = download(dc.at(off_c), nc * ec);

  // Reference, with op(A) as [m][k] and op(B) as [n][k] rows so the inner loop is contiguous.
  const double scale = f8 ? double(a_scale) * double(b_scale) : 1.0;
  double acc_tol = 2.0 * cs.k * std::ldexp(1.0, -24);
  if (co.tf32) acc_tol += std::ldexp(1.0, -9);
  if (f8) acc_tol = 1e-2;
  double norm_tol = co.c != DType::f32 || f8 ? 1e-2 : co.tf32 ? 2e-3 : 1e-5;
  if (has_gelu(cs.epilogue)) norm_tol = std::max(norm_tol, 2e-3);
  std::vector<double> opa(cs.m * cs.k), opb(cs.n * cs.k);
  double err2 = 0, ref2 = 0, worst = 0;
  std::size_t bad = 0, poison_changed = 0;
  for (std::int64_t bi = 0; bi < cs.batch; ++bi) {
    for (std::int64_t i = 0; i < cs.m; ++i) {
      for (std::int64_t p = 0; p < cs.k; ++p) {
        opa[i * cs.k + p] = a.value[bi * stride_a + (cs.ta ? p * lda + i : i * lda + p)];
      }
    }
    for (std::int64_t j = 0; j < cs.n; ++j) {
      for (std::int64_t p = 0; p < cs.k; ++p) {
        opb[j * cs.k + p] = b.value[bi * stride_b + (cs.tb ? j * ldb + p : p * ldb + j)];
      }
    }
    for (std::int64_t i = 0; i < cs.m; ++i) {
      for (std::int64_t j = 0; j < cs.n; ++j) {
        double sum = 0, abs_sum = 0;
        const double* x = &opa[i * cs.k];
        const double* y = &opb[j * cs.k];
        for (std::int64_t p = 0; p < cs.k; ++p) {
          sum += x[p] * y[p];
          abs_sum += std::abs(x[p] * y[p]);
        }
        const std::int64_t ci = bi * stride_c + i * ldc + j;
        const double bj = has_bias(cs.epilogue) ? bias.value[j] : 0.0;
        const double z = cs.alpha * scale * sum + cs.beta * c.value[ci] + bj;
        const double s = std::abs(cs.alpha * scale) * abs_sum + std::abs(cs.beta * c.value[ci]) + std::abs(bj);
        const double ref = has_gelu(cs.epilogue) ? gelu_tanh(z) : z;
        // An epilogue may round alpha*AB + beta*C to the output type before adding the bias or applying
        // GELU: one more output rounding, of a value no larger than S.
        double tol = acc_tol * s + (cs.epilogue != GemmEpilogue::none ? ulp(s, co.c) : 0.0);
        if (has_gelu(cs.epilogue)) tol = 1.2 * tol + std::ldexp(std::abs(z), -10);
        tol += ulp(ref, co.c) + 1e-30;
        const double g_ij = decode_output(&got[ci * ec], co.c);
        const double err = std::abs(g_ij - ref);
        bad += !(err <= tol);
        worst = std::max(worst, err / tol);
        err2 += (g_ij - ref) * (g_ij - ref);
        ref2 += ref * ref;
      }
    }
  }
  // Everything outside the live [m, n] blocks must still be 0xFF.
  for (std::int64_t i = 0; i < nc; ++i) {
    const std::int64_t in_batch = i % stride_c, col = in_batch % ldc;
    if (in_batch < cs.m * ldc && col < cs.n) continue;
    for (std::size_t q = 0; q < ec; ++q) poison_changed += got[i * ec + q] != 0xff;
  }
  EXPECT_EQ(bad, 0u) << "worst error / tolerance = " << worst;
  // Normwise only over enough elements: a handful can all sit near zero (GELU of negative values),
  // where only the elementwise bound above is meaningful.
  if (cs.m * cs.n * cs.batch >= 64) {
    const double normwise = std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-300);
    EXPECT_LE(normwise, norm_tol);
  }
  EXPECT_EQ(poison_changed, 0u);
}

const Combo kCombos[] = {
    {DType::f32, DType::f32, DType::f32, false},         {DType::f32, DType::f32, DType::f32, true},
    {DType::bf16, DType::bf16, DType::bf16, false},      {DType::bf16, DType::bf16, DType::f32, false},
    {DType::f16, DType::f16, DType::f16, false},         {DType::f16, DType::f16, DType::f32, false},
    {DType::f8_e4m3, DType::f8_e4m3, DType::bf16, false}, {DType::f8_e4m3, DType::f8_e4m3, DType::f32, false},
    {DType::f8_e4m3, DType::f8_e5m2, DType::bf16, false}, {DType::f8_e4m3, DType::f8_e5m2, DType::f32, false},
};

// The transposes a combo supports: fp8 only A [m, k] and B [n, k].
std::vector<std::pair<bool, bool>> transposes(const Combo& c) {
  if (is_f8(c.a)) return {{false, true}};
  return {{false, false}, {false, true}, {true, false}, {true, true}};
}

std::vector<GemmEpilogue> epilogues(const Combo& c) {
  if (is_f8(c.a) && c.c != DType::bf16) return {GemmEpilogue::none, GemmEpilogue::gelu};  // bias needs bf16
  return {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::gelu, GemmEpilogue::bias_gelu};
}

// ---- device tests ----

TEST(CudaGemmLt, EveryComboTransposeAndEpilogueMatchesF64Reference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  std::uint64_t seed = 100;
  for (const Combo& co : kCombos) {
    const bool f8 = is_f8(co.a);
    const std::int64_t shapes[][3] = {{129, 64, f8 ? 320 : 300}, {7, f8 ? 8 : 1, f8 ? 16 : 129}};
    for (auto [ta, tb] : transposes(co)) {
      for (GemmEpilogue ep : epilogues(co)) {
        for (const auto& s : shapes) {
          for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{0.75f, -0.5f}}) {
            Case cs{co, ta, tb, s[0], s[1], s[2], ep, alpha, beta};
            check_case(cs, seed += 4);
          }
        }
      }
    }
  }
}

// m, n, k over {1, 7, 64, 129, 300} (fp8, which needs k % 16 == 0 and n * sizeof(c) % 16 == 0: n over
// {8, 24, 64, 136, 304}, k over {16, 64, 320}), cycling through the transposes, the epilogues and beta so
// that every shape meets several of them.
TEST(CudaGemmLt, OddShapesMatchF64Reference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const std::int64_t sizes[] = {1, 7, 64, 129, 300};
  const std::int64_t f8_ns[] = {8, 24, 64, 136, 304};
  const std::int64_t f8_ks[] = {16, 64, 320};
  std::uint64_t seed = 5000;
  for (const Combo& co : kCombos) {
    const bool f8 = is_f8(co.a);
    const auto tr = transposes(co);
    const auto eps = epilogues(co);
    std::size_t index = 0;
    for (std::int64_t m : sizes) {
      for (std::int64_t n : f8 ? f8_ns : sizes) {
        for (std::int64_t k : f8 ? std::vector<std::int64_t>(std::begin(f8_ks), std::end(f8_ks))
                                 : std::vector<std::int64_t>(std::begin(sizes), std::end(sizes))) {
          const auto [ta, tb] = tr[index % tr.size()];
          Case cs{co, ta, tb, m, n, k, eps[(index / 2) % eps.size()], 1.f, index % 3 == 0 ? 0.5f : 0.f};
          check_case(cs, seed += 4);
          ++index;
        }
      }
    }
  }
}

TEST(CudaGemmLt, StridedBatchesMatchF64Reference) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  std::uint64_t seed = 9000;
  for (const Combo& co : kCombos) {
    const bool f8 = is_f8(co.a);
    const auto [ta, tb] = transposes(co).back();
    const GemmEpilogue ep = epilogues(co).back();
    check_case(Case{co, ta, tb, 65, f8 ? 40 : 33, f8 ? 48 : 47, ep, 0.75f, -0.5f, 3}, seed += 4);
    check_case(Case{co, ta, tb, 9, 40, f8 ? 32 : 31, GemmEpilogue::none, 1.f, 0.f, 4, /*broadcast_b=*/true},
               seed += 4);
  }
}

// The heuristic's choice is cached per shape and pointer alignment: the same shape at addresses one
// element past the aligned ones must get an algorithm that works there.
TEST(CudaGemmLt, MisalignedPointersAfterAlignedOnesOfTheSameShape) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  std::uint64_t seed = 12000;
  for (const Combo& co : kCombos) {
    if (is_f8(co.a)) continue;  // fp8 refuses pointers that are not 16-byte aligned
    for (std::size_t misalign : {std::size_t{0}, std::size_t{1}}) {
      Case cs{co, false, false, 256, 128, 64, GemmEpilogue::bias, 1.f, 0.f};
      cs.misalign = misalign;
      check_case(cs, seed += 4);
    }
  }
}

TEST(CudaGemmLt, TimeRepsReturnsOneTimePerRep) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  DeviceBuffer buf(4096);
  int calls = 0;
  const std::vector<float> ms =
      cuda::time_reps_ms(0, 5, [&](int i) {
        EXPECT_EQ(i, calls++);
        cuda::fill(buf.at(), DType::f32, 1024, i, 0);
      });
  ASSERT_EQ(ms.size(), 5u);
  for (float t : ms) EXPECT_GE(t, 0.f);
  EXPECT_EQ(calls, 5);
  EXPECT_THROW(cuda::time_reps_ms(0, 0, [](int) {}), Error);
}

// ---- argument checks: no device needed ----

std::string message(const GemmLtArgs& g, const void* a, const void* b, void* c, int device = 0) {
  try {
    cuda::gemm_lt(g, a, b, c, device);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

GemmLtArgs valid_args(DType a, DType b, DType c, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmLtArgs g;
  g.a_type = a;
  g.b_type = b;
  g.c_type = c;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = n;
  g.ldc = n;
  if (is_f8(a)) {
    g.trans_b = true;
    g.ldb = k;
  }
  return g;
}

TEST(CudaGemmLt, RefusesBadArgumentsBeforeTouchingTheDevice) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "built without CUDA: gemm_lt only says so";
  alignas(256) static std::uint8_t host[4096];
  void* p = host;
  const float one = 1.f;
  struct Expect {
    GemmLtArgs args;
    std::string needle;
    void* a;
  };
  std::vector<Expect> cases;
  auto add = [&](GemmLtArgs g, std::string needle, void* a = nullptr) {
    cases.push_back({g, std::move(needle), a ? a : p});
  };
  using D = DType;
  add(valid_args(D::f32, D::bf16, D::f32, 4, 4, 4), "f32 x bf16 -> f32 is not supported");
  add(valid_args(D::bf16, D::bf16, D::f16, 4, 4, 4), "bf16 x bf16 -> f16 is not supported");
  add(valid_args(D::f8_e5m2, D::f8_e5m2, D::bf16, 16, 16, 16), "f8_e5m2 x f8_e5m2 -> bf16 is not supported");
  add(valid_args(D::f8_e4m3, D::f8_e4m3, D::f16, 16, 16, 16), "f8_e4m3 x f8_e4m3 -> f16 is not supported");
  add(valid_args(D::i32, D::i32, D::i32, 4, 4, 4), "i32 x i32 -> i32 is not supported");
  {
    auto g = valid_args(D::f32, D::f32, D::f32, 4, 4, 4);
    g.m = -1;
    add(g, "negative size");
  }
  add(valid_args(D::f32, D::f32, D::f32, 4, 4, 0), "k=0 is not supported");
  {
    auto g = valid_args(D::f32, D::f32, D::f32, 4, 4, 8);
    g.lda = 7;
    add(g, "lda=7");
  }
  {
    auto g = valid_args(D::bf16, D::bf16, D::bf16, 4, 6, 8);
    g.trans_b = true;  // B is [6, 8]: ldb >= 8
    g.ldb = 6;
    add(g, "ldb=6");
  }
  {
    auto g = valid_args(D::f32, D::f32, D::f32, 4, 5, 4);
    g.ldc = 4;
    add(g, "ldc=4");
  }
  {
    auto g = valid_args(D::f32, D::f32, D::f32, 4, 5, 4);
    g.batch = 2;
    g.stride_a = 16;
    g.stride_b = 20;
    g.stride_c = 19;  // 4 rows of 5: 20 elements
    add(g, "overlap");
  }
  {
    auto g = valid_args(D::f32, D::f32, D::f32, 4, 4, 4);
    g.epilogue = GemmEpilogue::bias_gelu;
    add(g, "epilogue bias_gelu needs a bias");
  }
  {
    auto g = valid_args(D::f32, D::f32, D::f32, 4, 4, 4);
    g.epilogue = GemmEpilogue::gelu;
    g.bias = p;
    add(g, "epilogue gelu adds none");
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 16, 16);
    g.amax_d = reinterpret_cast<float*>(p);
    add(g, "c_scale and amax_d apply to fp8 outputs");
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 16, 16);
    g.c_scale = &one;
    add(g, "c_scale and amax_d apply to fp8 outputs");
  }
  {
    auto g = valid_args(D::bf16, D::bf16, D::bf16, 4, 4, 4);
    g.a_scale = &one;
    add(g, "apply to f8 inputs only");
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 16, 16);
    g.trans_b = false;
    g.ldb = 16;
    add(g, "\"TN\"");
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e5m2, D::bf16, 16, 16, 24);
    add(g, "multiples of 16 (k=24");
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 16, 32);
    g.lda = 40;
    add(g, "lda=40");
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 12, 32);
    add(g, "n * sizeof(bf16)");  // n = 12: 24 bytes
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 16, 32);
    g.ldc = 20;  // 40 bytes
    add(g, "ldc * sizeof(bf16)");
  }
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::f32, 16, 16, 16);
    g.epilogue = GemmEpilogue::bias;
    g.bias = p;
    add(g, "needs a bf16 output");
  }
  add(valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 16, 16), "16-byte aligned", host + 8);
  {
    auto g = valid_args(D::f8_e4m3, D::f8_e4m3, D::bf16, 16, 16, 16);
    g.a_scale = reinterpret_cast<const float*>(host + 256);
    g.b_scale = reinterpret_cast<const float*>(host + 260);
    add(g, "scales must be 16-byte aligned");
  }
  for (const Expect& e : cases) {
    const std::string what = message(e.args, e.a, p, p);
    EXPECT_EQ(what.rfind("cuda::gemm_lt: ", 0), 0u) << what;
    EXPECT_NE(what.find(e.needle), std::string::npos) << "expected \"" << e.needle << "\" in: " << what;
  }
  // Null pointers, once there is something to compute.
  EXPECT_NE(message(valid_args(D::f32, D::f32, D::f32, 2, 2, 2), nullptr, p, p).find("null pointer"),
            std::string::npos);
  // An empty output is a no-op, device or not.
  EXPECT_EQ(message(valid_args(D::f32, D::f32, D::f32, 0, 4, 4), nullptr, nullptr, nullptr), "(no error)");
  auto no_batches = valid_args(D::f32, D::f32, D::f32, 4, 4, 4);
  no_batches.batch = 0;
  EXPECT_EQ(message(no_batches, nullptr, nullptr, nullptr), "(no error)");
}

TEST(CudaGemmLt, ValidArgumentsReachTheDeviceCheck) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "built without CUDA: gemm_lt only says so";
  alignas(256) static std::uint8_t host[256];
  const GemmLtArgs g = valid_args(DType::f32, DType::f32, DType::f32, 2, 2, 2);
  const std::string what = message(g, host, host, host, 99);
  EXPECT_EQ(what.rfind("cuda::gemm_lt: ", 0), 0u) << what;
  if (cuda::is_available()) {
    EXPECT_NE(what.find("device index 99"), std::string::npos) << what;
  } else {
    EXPECT_NE(what.find(cuda::unavailable_reason()), std::string::npos) << what;
  }
}

TEST(CudaGemmLt, WithoutCudaEveryEntryPointSaysSo) {
  if (cuda::built_with_cuda()) GTEST_SKIP() << "built with CUDA";
  const GemmLtArgs g = valid_args(DType::f32, DType::f32, DType::f32, 2, 2, 2);
  float host[4] = {};
  EXPECT_NE(message(g, host, host, host).find("cuda::gemm_lt: memtrain was built without CUDA"), std::string::npos);
  EXPECT_THROW(cuda::time_reps_ms(0, 1, [](int) {}), Error);
}

}  // namespace
}  // namespace memtrain
