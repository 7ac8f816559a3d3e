// NF4 storage and nf4_linear (memtrain/ops/nf4.h): the level table, quantisation bit for bit against fixtures made
// by an independent float64 Python implementation (scripts/make_nf4_fixture.py), exact byte accounting, the
// dequantise-on-the-fly linear and its x-gradient against float64, the SIMD dequantisers against the scalar one,
// refusals, meta, the workspace bound that shows the full matrix never exists, and CUDA against the CPU.
#include "memtrain/ops/nf4.h"

#include "cpu/nf4_kernels.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using ops::Nf4Weight;

// The fixture's lines: "<key> <hex> <hex> ...".
std::map<std::string, std::vector<std::uint32_t>> read_fixture(const std::string& name) {
  std::ifstream in(std::string(MEMTRAIN_FIXTURES_DIR) + "/nf4/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::map<std::string, std::vector<std::uint32_t>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key, tok;
    ls >> key;
    while (ls >> tok) out[key].push_back(key == "shape" ? static_cast<std::uint32_t>(std::stoul(tok))
                                                        : static_cast<std::uint32_t>(std::stoul(tok, nullptr, 16)));
  }
  return out;
}

std::vector<float> as_floats(const std::vector<std::uint32_t>& bits) {
  std::vector<float> v(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) v[i] = std::bit_cast<float>(bits[i]);
  return v;
}

std::vector<double> to_f64(const Tensor& t) {
  const Tensor d = t.detach().to(Device::cpu()).to(DType::f64).contiguous();
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

// ref [N, out] = x [N, in] w^T in float64.
std::vector<double> matmul_t(const std::vector<double>& x, const std::vector<double>& w, std::int64_t N,
                             std::int64_t out, std::int64_t in) {
  std::vector<double> y(static_cast<std::size_t>(N * out), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (std::int64_t k = 0; k < in; ++k) s += x[n * in + k] * w[o * in + k];
      y[n * out + o] = s;
    }
  return y;
}

// max |a - b| / max |b|
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / den;
}

std::int64_t formula_bytes(std::int64_t n) { return n / 2 + n / 64 + 4 * ((n / 64 + 255) / 256); }

TEST(Nf4, LevelTableIsNf4) {
  const auto& v = ops::nf4_levels();
  ASSERT_EQ(v.size(), 16u);
  EXPECT_EQ(v.front(), -1.0f);
  EXPECT_EQ(v.back(), 1.0f);
  EXPECT_EQ(v[7], 0.0f);
  int pos = 0, neg = 0;
  for (int i = 0; i < 16; ++i) {
    if (i > 0) {
      EXPECT_LT(v[i - 1], v[i]);
    }
    pos += v[i] > 0 ? 1 : 0;
    neg += v[i] < 0 ? 1 : 0;
  }
  EXPECT_EQ(pos, 8);
  EXPECT_EQ(neg, 7);
  EXPECT_EQ(v[8], 0.07958029955625534f);  // bitsandbytes' first positive level
}

TEST(Nf4, QuantisationMatchesFixturesBitForBit) {
  for (const char* name : {"small_zero_outlier.txt", "rows_span_blocks.txt", "two_absmax_blocks.txt"}) {
    SCOPED_TRACE(name);
    auto f = read_fixture(name);
    const std::int64_t rows = f["shape"][0], cols = f["shape"][1];
    const std::vector<float> w = as_floats(f["weight"]);
    const Nf4Weight q = ops::nf4_quantize(tensor(w, {rows, cols}));
    EXPECT_EQ(std::bit_cast<std::uint32_t>(q.absmax_mean), f["mean"][0]);
    ASSERT_EQ(q.codes.numel(), static_cast<std::int64_t>(f["codes"].size()));
    for (std::int64_t i = 0; i < q.codes.numel(); ++i)
      ASSERT_EQ(q.codes.data<std::uint8_t>()[i], f["codes"][i]) << "code byte " << i;
    ASSERT_EQ(q.absmax_codes.numel(), static_cast<std::int64_t>(f["absmax_codes"].size()));
    for (std::int64_t i = 0; i < q.absmax_codes.numel(); ++i)
      ASSERT_EQ(q.absmax_codes.data<std::uint8_t>()[i], f["absmax_codes"][i]) << "absmax code " << i;
    ASSERT_EQ(q.absmax_scales.numel(), static_cast<std::int64_t>(f["absmax_scales"].size()));
    for (std::int64_t i = 0; i < q.absmax_scales.numel(); ++i)
      EXPECT_EQ(std::bit_cast<std::uint32_t>(q.absmax_scales.data<float>()[i]), f["absmax_scales"][i]);
    const Tensor d = ops::nf4_dequantize(q, DType::f32);
    for (std::int64_t i = 0; i < d.numel(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(d.data<float>()[i]), f["dequantized"][i]) << "element " << i;
  }
}

TEST(Nf4, BytesAre4127BitsPerParameterAndAccounted) {
  manual_seed(11);
  Allocator& alloc = Allocator::get(Device::cpu());
  for (const Shape& shape : {Shape{768, 768}, Shape{768, 3072}}) {
    const Tensor w = randn(shape);
    const std::int64_t n = w.numel();
    const std::size_t before = alloc.stats()[MemoryCategory::parameters].live_bytes;
    const Nf4Weight q = ops::nf4_quantize(w);
    const std::size_t accounted = alloc.stats()[MemoryCategory::parameters].live_bytes - before;
    EXPECT_EQ(q.bytes(), formula_bytes(n));
    EXPECT_EQ(static_cast<double>(q.bytes()) * 8.0, static_cast<double>(n) * (4.0 + 8.0 / 64 + 32.0 / (64 * 256)));
    EXPECT_EQ(static_cast<std::int64_t>(accounted), q.bytes());
  }
}

TEST(Nf4, LinearForwardMatchesFloat64) {
  manual_seed(12);
  const std::int64_t N = 37, out = 600, in = 128;  // 600 rows: tiles of 256, 256, 88
  const Tensor w = randn({out, in}), x = randn({N, in}), b = randn({out});
  const Nf4Weight q = ops::nf4_quantize(w);
  const Tensor y = ops::nf4_linear(x, q, b);
  ASSERT_EQ(y.shape(), (Shape{N, out}));
  std::vector<double> ref = matmul_t(to_f64(x), to_f64(ops::nf4_dequantize(q, DType::f32)), N, out, in);
  const std::vector<double> bias = to_f64(b);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < out; ++o) ref[n * out + o] += bias[o];
  // f32 GEMM over in = 128 products: a few f32 ulps of the largest output.
  EXPECT_LT(rel_err(to_f64(y), ref), 1e-5);
}

TEST(Nf4, InputGradientMatchesFloat64AndFiniteDifferences) {
  manual_seed(13);
  const std::int64_t N = 5, out = 320, in = 96;  // in = 96: tiles of 2-row multiples keep whole blocks
  const Tensor w = randn({out, in}), r = randn({N, out});
  const Nf4Weight q = ops::nf4_quantize(w);
  Tensor x = randn({N, in}).set_requires_grad(true);
  Tensor b = randn({out}).set_requires_grad(true);
  ops::sum(ops::mul(ops::nf4_linear(x, q, b), r)).backward();
  // dx = r W (float64 over the dequantised W), db = column sums of r.
  const std::vector<double> wd = to_f64(ops::nf4_dequantize(q, DType::f32)), rd = to_f64(r);
  std::vector<double> ref(static_cast<std::size_t>(N * in), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < in; ++k)
      for (std::int64_t o = 0; o < out; ++o) ref[n * in + k] += rd[n * out + o] * wd[o * in + k];
  EXPECT_LT(rel_err(to_f64(x.grad()), ref), 1e-5);
  const std::vector<double> db = to_f64(b.grad());
  for (std::int64_t o = 0; o < out; ++o) {
    double s = 0.0;
    for (std::int64_t n = 0; n < N; ++n) s += rd[n * out + o];
    EXPECT_NEAR(db[o], s, 1e-5);
  }
  // Central differences of the (linear) loss in f32: exact up to the loss's rounding, ~1e-3 relative here.
  const std::vector<double> g = to_f64(x.grad());
  auto loss = [&](const Tensor& xv) { return ops::sum(ops::mul(ops::nf4_linear(xv, q, b.detach()), r)).item(); };
  for (const std::int64_t i : {0L, 7L, 95L, 200L, 479L}) {
    const double eps = 0.05;
    Tensor xp = x.detach().clone(), xm = x.detach().clone();
    xp.data<float>()[i] += static_cast<float>(eps);
    xm.data<float>()[i] -= static_cast<float>(eps);
    const double fd = (loss(xp) - loss(xm)) / (2 * eps);
    EXPECT_NEAR(fd, g[static_cast<std::size_t>(i)], 2e-2 * std::max(1.0, std::fabs(g[static_cast<std::size_t>(i)])))
        << "element " << i;
  }
}

TEST(Nf4, Bf16InputUsesABf16Tile) {
  manual_seed(14);
  const std::int64_t N = 9, out = 300, in = 128;
  const Tensor w = randn({out, in});
  const Nf4Weight q = ops::nf4_quantize(w);
  Tensor x = randn({N, in}).to(DType::bf16).set_requires_grad(true);
  const Tensor y = ops::nf4_linear(x, q);
  ASSERT_EQ(y.dtype(), DType::bf16);
  // The reference multiplies the bf16-rounded W (the tile) and the bf16 x in float64; y is rounded to bf16 once
  // after an f32 accumulation: within 2^-8 of the largest output.
  const std::vector<double> wb = to_f64(ops::nf4_dequantize(q, DType::bf16));
  EXPECT_LT(rel_err(to_f64(y), matmul_t(to_f64(x), wb, N, out, in)), 1.0 / 256);
  ops::sum(y).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  std::vector<double> ref(static_cast<std::size_t>(N * in), 0.0);  // dx = ones W
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < in; ++k)
      for (std::int64_t o = 0; o < out; ++o) ref[n * in + k] += wb[o * in + k];
  EXPECT_LT(rel_err(to_f64(x.grad()), ref), 1.0 / 256);
}

TEST(Nf4, SimdDequantisersMatchScalarBitForBit) {
  manual_seed(15);
  const Nf4Weight q = ops::nf4_quantize(ops::mul(randn({96, 512}), 0.1));
  const cpu::nf4::DequantPath chosen = cpu::nf4::dequant_path();
  cpu::nf4::set_dequant_path(cpu::nf4::DequantPath::scalar);
  const Tensor ref32 = ops::nf4_dequantize(q, DType::f32), ref16 = ops::nf4_dequantize(q, DType::bf16);
  int tested = 0;
  for (const auto path : {cpu::nf4::DequantPath::avx2, cpu::nf4::DequantPath::avx512}) {
    if (!cpu::nf4::path_supported(path)) {
      std::printf("nf4: %s not supported by this CPU (compiled, not run)\n",
                  path == cpu::nf4::DequantPath::avx2 ? "AVX2" : "AVX-512");
      continue;
    }
    cpu::nf4::set_dequant_path(path);
    const Tensor d32 = ops::nf4_dequantize(q, DType::f32), d16 = ops::nf4_dequantize(q, DType::bf16);
    EXPECT_EQ(std::memcmp(d32.data_ptr(), ref32.data_ptr(), ref32.nbytes()), 0);
    EXPECT_EQ(std::memcmp(d16.data_ptr(), ref16.data_ptr(), ref16.nbytes()), 0);
    ++tested;
  }
  cpu::nf4::set_dequant_path(chosen);
  EXPECT_GE(tested, 1) << "no vector path ran";
}

void expect_refused(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "not refused: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Nf4, RefusesBadInput) {
  expect_refused([] { ops::nf4_quantize(randn({128})); }, "nf4_quantize");
  expect_refused([] { ops::nf4_quantize(randn({3, 40})); }, "[3, 40]");
  expect_refused([] { ops::nf4_quantize(Tensor::empty({4, 64}, DType::i32)); }, "nf4_quantize");
  const Nf4Weight q = ops::nf4_quantize(randn({4, 64}));
  expect_refused([&] { ops::nf4_linear(randn({2, 32}), q); }, "nf4_linear");
  expect_refused([&] { ops::nf4_linear(Tensor::empty({2, 64}, DType::i32), q); }, "nf4_linear");
  expect_refused([&] { ops::nf4_linear(randn({2, 64}), q, randn({5})); }, "nf4_linear");
  expect_refused([&] { ops::nf4_dequantize(Nf4Weight{}, DType::f32); }, "nf4_dequantize");
}

TEST(Nf4, MetaTensorsGetTheBytesWithoutCompute) {
  Allocator& alloc = Allocator::get(Device::meta());
  const std::size_t before = alloc.stats()[MemoryCategory::parameters].live_bytes;
  const Tensor w = Tensor::empty({768, 3072}, DType::bf16, Device::meta());
  const Nf4Weight q = ops::nf4_quantize(w);
  EXPECT_EQ(q.bytes(), formula_bytes(768 * 3072));
  EXPECT_EQ(static_cast<std::int64_t>(alloc.stats()[MemoryCategory::parameters].live_bytes - before), q.bytes());
  EXPECT_EQ(q.codes.device(), Device::meta());
  const Tensor y = ops::nf4_linear(Tensor::empty({4, 3072}, DType::f32, Device::meta()), q);
  EXPECT_EQ(y.shape(), (Shape{4, 768}));
  EXPECT_EQ(y.device(), Device::meta());
}

TEST(Nf4, LinearWorkspaceStaysBelowTheFullMatrix) {
  manual_seed(16);
  const std::int64_t out = 3072, in = 768;
  const Nf4Weight q = ops::nf4_quantize(randn({out, in}));
  Allocator& alloc = Allocator::get(Device::cpu());
  const std::size_t full = static_cast<std::size_t>(out * in) * sizeof(float);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    Tensor x = randn({64, in}).to(dtype).set_requires_grad(true);
    const std::size_t base = alloc.stats()[MemoryCategory::workspace].live_bytes;
    alloc.reset_peak();
    ops::sum(ops::nf4_linear(x, q)).backward();
    const std::size_t peak = alloc.stats()[MemoryCategory::workspace].peak_bytes - base;
    std::printf("nf4_linear %s: peak workspace %zu bytes, full f32 matrix %zu\n", dtype == DType::f32 ? "f32" : "bf16",
                peak, full);
    EXPECT_GT(peak, 0u);
    EXPECT_LT(peak, full / 4);
  }
}

TEST(Nf4, CudaMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  manual_seed(17);
  const Tensor w = randn({640, 192}), x = randn({33, 192});
  const Nf4Weight qc = ops::nf4_quantize(w), qg = ops::nf4_quantize(w.to(Device::cuda()));
  // The codes are the CPU quantiser's on both devices (CUDA quantises on the host).
  EXPECT_EQ(std::memcmp(qg.codes.to(Device::cpu()).data_ptr(), qc.codes.data_ptr(), qc.codes.nbytes()), 0);
  EXPECT_EQ(qg.absmax_mean, qc.absmax_mean);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const Tensor c = ops::nf4_dequantize(qc, dtype), g = ops::nf4_dequantize(qg, dtype).to(Device::cpu());
    EXPECT_EQ(std::memcmp(g.data_ptr(), c.data_ptr(), c.nbytes()), 0) << "dequantised bits differ";
  }
  // cuBLAS and the CPU GEMM sum in different orders: f32 rounding of a 192-term dot product.
  const Tensor yc = ops::nf4_linear(x, qc), yg = ops::nf4_linear(x.to(Device::cuda()), qg);
  EXPECT_LT(rel_err(to_f64(yg), to_f64(yc)), 1e-5);
  Tensor xg = x.to(Device::cuda()).set_requires_grad(true);
  ops::sum(ops::nf4_linear(xg, qg)).backward();
  Tensor xc = x.clone().set_requires_grad(true);
  ops::sum(ops::nf4_linear(xc, qc)).backward();
  EXPECT_LT(rel_err(to_f64(xg.grad()), to_f64(xc.grad())), 1e-5);
}

}  // namespace
}  // namespace memtrain
