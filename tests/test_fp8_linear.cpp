// amp::fp8_linear: forward and backward against float64 loops over the dequantized FP8 operands (quantized in the
// test by the tested amp:: functions), against plain f32 linear within FP8's error, delayed scaling's amax
// bookkeeping, the bytes the op keeps for backward, checkpointing, and bad inputs.
#include "memtrain/amp/fp8_linear.h"

#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "op_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using amp::Fp8Format;
using amp::Fp8LinearMeta;
using amp::Fp8Recipe;
using amp::Fp8ScalingKind;
using amp::Fp8Tiling;
using amp::Fp8Weight;
using testing::values_of;

// Neither a multiple of 128: partial edge tiles along both axes of the weight and along x's rows.
constexpr std::int64_t kIn = 200, kOut = 150, kRows = 6;
const Shape kXShape{2, 3, kIn};
const Shape kYShape{2, 3, kOut};

Fp8Recipe recipe_of(Fp8ScalingKind kind) {
  Fp8Recipe r;
  r.kind = kind;
  return r;
}

struct Inputs {
  Tensor x, w, b, dy;
};

// x's rows and its second column tile differ in magnitude, so one scale per tile is not one scale per tensor.
Inputs make_inputs(DType x_dtype, std::uint64_t seed) {
  std::vector<double> xv = values_of(testing::normal(kXShape, seed));
  for (std::int64_t n = 0; n < kRows; ++n) {
    for (std::int64_t i = 0; i < kIn; ++i) xv[n * kIn + i] *= static_cast<double>(n + 1) * (i < 128 ? 1.0 : 8.0);
  }
  Inputs in;
  in.x = tensor(xv, kXShape).to(x_dtype).set_requires_grad();
  in.w = ops::mul(testing::normal({kOut, kIn}, seed + 1), 0.1).to(DType::f32).set_requires_grad();
  in.b = testing::normal({kOut}, seed + 2, DType::f32).set_requires_grad();
  in.dy = testing::normal(kYShape, seed + 3).to(x_dtype);
  return in;
}

float max_abs(const Tensor& t) {
  double m = 0;
  for (const double v : values_of(t)) m = std::max(m, std::abs(v));
  return static_cast<float>(m);
}

// What FP8 keeps of t seen as (rows, last dim): with one scale (delayed; inverse 1/scale in f32, TE's rule) or
// one per tile.
std::vector<double> fp8_values(const Tensor& t, Fp8Format f, Fp8ScalingKind kind, float scale, Fp8Tiling tiling) {
  const Tensor m = t.detach().reshape({-1, t.size(-1)});
  if (kind == Fp8ScalingKind::delayed) {
    return values_of(amp::dequantize_fp8(amp::quantize_fp8(m, f, scale), 1.0f / scale));
  }
  return values_of(amp::dequantize_fp8_blockwise(amp::quantize_fp8_blockwise(m, f, tiling)));
}

// C[i, j] = sum_l a(i, l) b(l, j) in float64, with sum_l |a b| (the size of f32's summation error).
struct Product {
  std::vector<double> value, magnitude;
};

template <typename A, typename B>
Product product(std::int64_t m, std::int64_t n, std::int64_t k, A a, B b) {
  Product p{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        const double t = a(i, l) * b(l, j);
        s += t;
        mag += std::abs(t);
      }
      p.value[i * n + j] = s;
      p.magnitude[i * n + j] = mag;
    }
  }
  return p;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

double relative_error(const Tensor& a, const Tensor& b) { return relative_error(values_of(a), values_of(b)); }

// f32 results: the f32 sum of the same products, so normwise within f32 rounding (1e-5). bf16 results: each element
// within bf16's rounding (2^-8 relative) plus f32's summation error (1e-5 of the products' magnitudes).
void expect_matches(const Tensor& actual, DType dtype, const Product& ref, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  EXPECT_EQ(actual.dtype(), dtype) << what;
  const std::vector<double> a = values_of(actual);
  ASSERT_EQ(a.size(), ref.value.size()) << what;
  EXPECT_LT(relative_error(a, ref.value), dtype == DType::f32 ? 1e-5 : std::ldexp(1.0, -8)) << what;
  if (dtype != DType::bf16) return;
  int failures = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double tol = std::ldexp(std::abs(ref.value[i]), -8) + 1e-5 * ref.magnitude[i];
    if (std::abs(a[i] - ref.value[i]) > tol && failures++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << ", expected " << ref.value[i];
    }
  }
}

struct Scales {
  float input = 1, weight = 1, grad = 1;  // delayed: the meta's scales before the step
};

Scales scales_of(const Fp8LinearMeta* meta) {
  if (meta == nullptr) return {};
  return {meta->input.scale(), meta->weight.scale(), meta->grad.scale()};
}

// One step of y = fp8_linear(x, w, b), backward with dy, each result against float64 loops over the FP8 values
// of x, w (E4M3) and dy (E5M2) quantized with the scales the meta held before the step.
void check_step(Inputs in, Fp8ScalingKind kind, Fp8LinearMeta* meta) {  // by value: handles share the tensors
  const Fp8Recipe recipe = recipe_of(kind);
  const Scales s = scales_of(meta);
  in.x.set_grad(Tensor());
  in.w.set_grad(Tensor());
  in.b.set_grad(Tensor());
  const Fp8Weight wq = amp::quantize_weight(in.w, recipe, meta);
  const Tensor y = amp::fp8_linear(in.x, in.w, wq, in.b, recipe, meta);
  EXPECT_EQ(y.shape(), kYShape);
  y.backward(in.dy);

  const std::vector<double> xd = fp8_values(in.x, Fp8Format::e4m3, kind, s.input, Fp8Tiling::row_1x128);
  const std::vector<double> wd = fp8_values(in.w, Fp8Format::e4m3, kind, s.weight, Fp8Tiling::block_128x128);
  const std::vector<double> gd = fp8_values(in.dy, Fp8Format::e5m2, kind, s.grad, Fp8Tiling::row_1x128);
  const std::vector<double> bias = values_of(in.b), dy = values_of(in.dy);

  Product y_ref = product(kRows, kOut, kIn, [&](auto n, auto i) { return xd[n * kIn + i]; },
                          [&](auto i, auto o) { return wd[o * kIn + i]; });
  for (std::int64_t n = 0; n < kRows; ++n) {
    for (std::int64_t o = 0; o < kOut; ++o) y_ref.value[n * kOut + o] += bias[o];
  }
  const Product dx_ref = product(kRows, kIn, kOut, [&](auto n, auto o) { return gd[n * kOut + o]; },
                                 [&](auto o, auto i) { return wd[o * kIn + i]; });
  const Product dw_ref = product(kOut, kIn, kRows, [&](auto o, auto n) { return gd[n * kOut + o]; },
                                 [&](auto n, auto i) { return xd[n * kIn + i]; });
  // db from the unquantized gradient.
  const Product db_ref = product(1, kOut, kRows, [](auto, auto) { return 1.0; },
                                 [&](auto n, auto o) { return dy[n * kOut + o]; });

  expect_matches(y, in.x.dtype(), y_ref, "y");
  EXPECT_EQ(in.x.grad().shape(), kXShape);
  expect_matches(in.x.grad(), in.x.dtype(), dx_ref, "dx");
  expect_matches(in.w.grad(), DType::f32, dw_ref, "dW");
  expect_matches(in.b.grad(), DType::f32, db_ref, "db");
}

// Delayed scales from x's, w's and dy's own amaxes, as after a step on the same data.
void warm_up(Fp8LinearMeta& meta, const Inputs& in) {
  meta.input.record_amax(max_abs(in.x));
  meta.weight.record_amax(max_abs(in.w));
  meta.grad.record_amax(max_abs(in.dy));
  meta.update_scales();
}

void check_against_float64(Fp8ScalingKind kind, DType x_dtype) {
  const Inputs in = make_inputs(x_dtype, 10);
  std::optional<Fp8LinearMeta> meta;
  if (kind == Fp8ScalingKind::delayed) warm_up(meta.emplace(), in);
  check_step(in, kind, meta ? &*meta : nullptr);
}

TEST(Fp8Linear, BlockwiseF32MatchesFloat64Reference) { check_against_float64(Fp8ScalingKind::blockwise, DType::f32); }
TEST(Fp8Linear, BlockwiseBf16MatchesFloat64Reference) { check_against_float64(Fp8ScalingKind::blockwise, DType::bf16); }
TEST(Fp8Linear, DelayedF32MatchesFloat64Reference) { check_against_float64(Fp8ScalingKind::delayed, DType::f32); }
TEST(Fp8Linear, DelayedBf16MatchesFloat64Reference) { check_against_float64(Fp8ScalingKind::delayed, DType::bf16); }

// A strided x (a transposed view) gives the bits of its contiguous copy, and its gradient comes back in x's shape.
TEST(Fp8Linear, StridedInputMatchesContiguous) {
  const Tensor base = testing::normal({kIn, kRows}, 15, DType::f32).set_requires_grad();
  const Tensor strided = base.t(), contiguous = base.detach().t().contiguous().set_requires_grad();
  const Tensor w = testing::normal({kOut, kIn}, 16, DType::f32);
  const Fp8Recipe recipe = recipe_of(Fp8ScalingKind::blockwise);
  const Fp8Weight wq = amp::quantize_weight(w, recipe, nullptr);
  const Tensor y = amp::fp8_linear(strided, w, wq, Tensor(), recipe, nullptr),
               y_ref = amp::fp8_linear(contiguous, w, wq, Tensor(), recipe, nullptr);
  EXPECT_EQ(values_of(y), values_of(y_ref));
  const Tensor dy = testing::normal({kRows, kOut}, 17, DType::f32);
  y.backward(dy);
  y_ref.backward(dy);
  EXPECT_EQ(base.grad().shape(), (Shape{kIn, kRows}));
  EXPECT_EQ(values_of(base.grad().t()), values_of(contiguous.grad()));
}

// FP8 against plain f32 linear. E4M3 keeps 3 mantissa bits (2^-4 relative per element at most), E5M2 2 bits (2^-3);
// over a sum of products the normwise error is about the per-element RMS: measured 0.034-0.035 (y) and 0.057-0.058
// (dx, dW) for both recipes, so 0.1 leaves a margin of 1.7x.
// db comes from the unquantized gradient: f32 rounding only.
void check_against_f32_linear(Fp8ScalingKind kind) {
  const Inputs in = make_inputs(DType::f32, 20);
  std::optional<Fp8LinearMeta> meta;
  if (kind == Fp8ScalingKind::delayed) warm_up(meta.emplace(), in);
  Fp8LinearMeta* m = meta ? &*meta : nullptr;
  const Fp8Recipe recipe = recipe_of(kind);
  const Tensor y = amp::fp8_linear(in.x, in.w, amp::quantize_weight(in.w, recipe, m), in.b, recipe, m);
  y.backward(in.dy);

  const Tensor x = in.x.detach().clone().set_requires_grad(), w = in.w.detach().clone().set_requires_grad(),
               b = in.b.detach().clone().set_requires_grad();
  const Tensor y32 = ops::linear(x, w, b);
  y32.backward(in.dy);

  const double ey = relative_error(y, y32), edx = relative_error(in.x.grad(), x.grad()),
               edw = relative_error(in.w.grad(), w.grad()), edb = relative_error(in.b.grad(), b.grad());
  std::printf("[fp8 vs f32, %s] y %.4f  dx %.4f  dW %.4f  db %.2e\n",
              kind == Fp8ScalingKind::delayed ? "delayed" : "blockwise", ey, edx, edw, edb);
  EXPECT_LT(ey, 0.1);
  EXPECT_LT(edx, 0.1);
  EXPECT_LT(edw, 0.1);
  EXPECT_LT(edb, 1e-6);
  // And FP8 did change something: the comparison is not vacuous.
  EXPECT_GT(ey, 1e-3);
  EXPECT_GT(edx, 1e-3);
}

TEST(Fp8LinearVsF32, BlockwiseWithinFp8Error) { check_against_f32_linear(Fp8ScalingKind::blockwise); }
TEST(Fp8LinearVsF32, DelayedWithinFp8Error) { check_against_f32_linear(Fp8ScalingKind::delayed); }

// Step 1 on a fresh meta quantizes with scale 1 and records the amaxes; update_scales turns them into
// fp8_max / amax; step 2, on inputs twice as large, still quantizes with step 1's scales (the ones from before the
// step) and records its own amaxes in the next slot.
TEST(Fp8LinearDelayed, RecordsAmaxesAndUsesTheScalesFromBeforeTheStep) {
  Inputs in = make_inputs(DType::f32, 30);
  Fp8LinearMeta meta;
  check_step(in, Fp8ScalingKind::delayed, &meta);
  const float ax = max_abs(in.x), aw = max_abs(in.w), ag = max_abs(in.dy);
  EXPECT_EQ(meta.input.amax_history().back(), ax);
  EXPECT_EQ(meta.weight.amax_history().back(), aw);
  EXPECT_EQ(meta.grad.amax_history().back(), ag);
  EXPECT_EQ(meta.input.scale(), 1.0f);

  meta.update_scales();
  EXPECT_EQ(meta.input.scale(), 448.0f / ax);
  EXPECT_EQ(meta.weight.scale(), 448.0f / aw);
  EXPECT_EQ(meta.grad.scale(), 57344.0f / ag);

  in.x = ops::mul(in.x.detach(), 2.0).set_requires_grad();
  in.w = ops::mul(in.w.detach(), 2.0).set_requires_grad();
  in.dy = ops::mul(in.dy, 2.0);
  check_step(in, Fp8ScalingKind::delayed, &meta);
  EXPECT_EQ(meta.input.scale(), 448.0f / ax);
  const std::vector<float> hx = meta.input.amax_history(), hw = meta.weight.amax_history(),
                           hg = meta.grad.amax_history();
  EXPECT_EQ(hx[hx.size() - 2], ax);
  EXPECT_EQ(hx.back(), 2 * ax);
  EXPECT_EQ(hw.back(), 2 * aw);
  EXPECT_EQ(hg.back(), 2 * ag);
}

TEST(Fp8LinearDelayed, StateSizes) {
  const Fp8LinearMeta meta(amp::DelayedScalingOptions{.history_len = 4});
  EXPECT_EQ(meta.grad.format(), Fp8Format::e5m2);
  EXPECT_EQ(meta.input.format(), Fp8Format::e4m3);
  EXPECT_EQ(meta.bytes(), 3u * (4 * 4 + 8));
  const Tensor w = testing::normal({kOut, kIn}, 1, DType::f32);
  Fp8LinearMeta m;
  EXPECT_EQ(amp::quantize_weight(w, recipe_of(Fp8ScalingKind::delayed), &m).bytes(), std::size_t(kOut * kIn + 4));
  // 128x128 blocks: a (2, 2) grid of f32 inverse scales.
  EXPECT_EQ(amp::quantize_weight(w, Fp8Recipe{}, nullptr).bytes(), std::size_t(kOut * kIn + 2 * 2 * 4));
}

std::size_t live(MemoryCategory c) { return Allocator::get(Device::cpu()).stats()[c].live_bytes; }

// Activation bytes a forward leaves alive once the caller has dropped its input: what the op saved plus its output.
// x is made inside the measurement (as a model's activation is), the weight needs a gradient, x does not.
template <typename Op>
std::size_t activation_bytes_kept(const Tensor& x_source, Op op, Tensor& y) {
  const std::size_t before = live(MemoryCategory::activations), workspace = live(MemoryCategory::workspace);
  {
    CategoryGuard activations(MemoryCategory::activations);
    const Tensor x = x_source.to(DType::bf16);
    y = op(x);
  }
  EXPECT_EQ(live(MemoryCategory::workspace), workspace) << "workspace left alive";
  return live(MemoryCategory::activations) - before;
}

TEST(Fp8LinearMemory, KeepsCodesScalesAndOutputOnlyLessThanBf16Linear) {
  const Tensor source = testing::normal(kXShape, 40, DType::f32);
  const Tensor w = testing::normal({kOut, kIn}, 41, DType::f32).set_requires_grad();
  const std::size_t codes = kRows * kIn, output = kRows * kOut * 2;

  const Tensor w_bf16 = w.detach().to(DType::bf16).set_requires_grad();
  Tensor y_bf16;
  const std::size_t bf16 =
      activation_bytes_kept(source, [&](const Tensor& x) { return ops::linear(x, w_bf16); }, y_bf16);
  EXPECT_EQ(bf16, kRows * kIn * 2 + output);  // x in bf16 and the output

  const Fp8Weight wq_block = amp::quantize_weight(w, Fp8Recipe{}, nullptr);
  Tensor y_block;
  const std::size_t block = activation_bytes_kept(
      source, [&](const Tensor& x) { return amp::fp8_linear(x, w, wq_block, Tensor(), Fp8Recipe{}, nullptr); },
      y_block);
  EXPECT_EQ(block, codes + kRows * 2 * 4 + output);  // 1x128 tiles: 2 f32 scales per row

  Fp8LinearMeta meta;
  const Fp8Recipe delayed = recipe_of(Fp8ScalingKind::delayed);
  const Fp8Weight wq_delayed = amp::quantize_weight(w, delayed, &meta);
  Tensor y_delayed;
  const std::size_t per_tensor = activation_bytes_kept(
      source, [&](const Tensor& x) { return amp::fp8_linear(x, w, wq_delayed, Tensor(), delayed, &meta); }, y_delayed);
  EXPECT_EQ(per_tensor, codes + 4 + output);

  EXPECT_LT(block, bf16);
  EXPECT_LT(per_tensor, bf16);
  // The backward still works from what was kept, and the saved bytes go with the graph.
  const std::size_t before_backward = live(MemoryCategory::activations);
  y_block.backward(testing::normal(kYShape, 42, DType::bf16));
  EXPECT_TRUE(w.grad().defined());
  EXPECT_EQ(live(MemoryCategory::activations), before_backward - codes - kRows * 2 * 4);
}

// gelu(fp8_linear(x)) with and without a checkpoint region: bit-identical gradients. With delayed scaling the
// re-run records the input amax again; the slot keeps the max, so the history is what the plain run left.
struct CkptResult {
  std::vector<double> dx, dw, db;
  std::vector<float> input_history, weight_history, grad_history;
};

enum class Region { none, full, selective };

CkptResult run_region(Fp8ScalingKind kind, Region region) {
  const Inputs in = make_inputs(DType::f32, 50);
  std::optional<Fp8LinearMeta> meta;
  if (kind == Fp8ScalingKind::delayed) warm_up(meta.emplace(), in);
  Fp8LinearMeta* m = meta ? &*meta : nullptr;
  const Fp8Recipe recipe = recipe_of(kind);
  const Fp8Weight wq = amp::quantize_weight(in.w, recipe, m);
  const auto fn = [&](const Tensor& x) { return ops::gelu(amp::fp8_linear(x, in.w, wq, in.b, recipe, m)); };
  const ckpt::Counters before = ckpt::counters();
  ckpt::RegionOptions options;  // full: keep nothing
  if (region == Region::selective) options.keep_ops = ckpt::default_keep_ops();
  const Tensor y = region == Region::none ? fn(in.x) : ckpt::checkpoint(fn, in.x, options);
  const std::vector<float> after_forward = m ? m->input.amax_history() : std::vector<float>{};
  y.backward(in.dy);
  EXPECT_EQ(ckpt::counters().recomputes - before.recomputes, region == Region::none ? 0 : 1);
  CkptResult r{values_of(in.x.grad()), values_of(in.w.grad()), values_of(in.b.grad()), {}, {}, {}};
  if (m) {
    EXPECT_EQ(m->input.amax_history(), after_forward) << "the re-run changed the input's amax history";
    r.input_history = m->input.amax_history();
    r.weight_history = m->weight.amax_history();
    r.grad_history = m->grad.amax_history();
  }
  return r;
}

void check_checkpoint(Fp8ScalingKind kind) {
  const CkptResult plain = run_region(kind, Region::none);
  for (const Region region : {Region::full, Region::selective}) {
    const CkptResult c = run_region(kind, region);
    EXPECT_EQ(c.dx, plain.dx);
    EXPECT_EQ(c.dw, plain.dw);
    EXPECT_EQ(c.db, plain.db);
    EXPECT_EQ(c.input_history, plain.input_history);
    EXPECT_EQ(c.weight_history, plain.weight_history);
    EXPECT_EQ(c.grad_history, plain.grad_history);
  }
}

TEST(Fp8LinearCheckpoint, BlockwiseGradientsBitIdentical) { check_checkpoint(Fp8ScalingKind::blockwise); }
TEST(Fp8LinearCheckpoint, DelayedGradientsBitIdenticalAndHistoryUnchangedByTheRerun) {
  check_checkpoint(Fp8ScalingKind::delayed);
}

TEST(Fp8Linear, BadInputsThrowWithTheOpName) {
  const Tensor x = testing::normal({4, kIn}, 60, DType::f32), w = testing::normal({kOut, kIn}, 61, DType::f32),
               b = testing::normal({kOut}, 62, DType::f32);
  const Fp8Recipe block = recipe_of(Fp8ScalingKind::blockwise), delayed = recipe_of(Fp8ScalingKind::delayed);
  Fp8LinearMeta meta;
  const Fp8Weight wq = amp::quantize_weight(w, block, nullptr), wq_delayed = amp::quantize_weight(w, delayed, &meta);
  const auto call = [&](const Tensor& xx, const Tensor& ww, const Fp8Weight& q, const Tensor& bb, const Fp8Recipe& r,
                        Fp8LinearMeta* m) { return [=] { amp::fp8_linear(xx, ww, q, bb, r, m); }; };
  using testing::expect_error;
  expect_error(call(x.to(DType::f64), w, wq, b, block, nullptr), {"fp8_linear", "input dtype f64"});
  expect_error(call(x, w.to(DType::f16), wq, b, block, nullptr), {"fp8_linear", "weight dtype f16"});
  expect_error(call(testing::normal({4, kIn + 1}, 63, DType::f32), w, wq, b, block, nullptr),
               {"fp8_linear", "does not match weight"});
  expect_error(call(x, w, wq, testing::normal({kOut + 1}, 64, DType::f32), block, nullptr), {"fp8_linear", "bias"});
  const Fp8Weight other = amp::quantize_weight(testing::normal({kOut, kIn - 1}, 65, DType::f32), block, nullptr);
  expect_error(call(x, w, other, b, block, nullptr), {"fp8_linear", "FP8 weight codes"});
  expect_error(call(x, w, Fp8Weight{}, b, block, nullptr), {"fp8_linear", "quantize_weight"});
  expect_error(call(x, w, wq, b, delayed, &meta), {"fp8_linear", "quantized for blockwise"});
  expect_error(call(x, w, wq_delayed, b, delayed, nullptr), {"fp8_linear", "Fp8LinearMeta"});
  Fp8Weight bad_scales = wq;
  bad_scales.inv_scales = Tensor::empty({1, 2}, DType::f32);
  expect_error(call(x, w, bad_scales, b, block, nullptr), {"fp8_linear", "inverse scales"});
  expect_error([&] { amp::quantize_weight(w, delayed, nullptr); }, {"amp::quantize_weight", "Fp8LinearMeta"});
  expect_error([&] { amp::quantize_weight(b, block, nullptr); }, {"amp::quantize_weight", "[out, in]"});
}

}  // namespace
}  // namespace memtrain
