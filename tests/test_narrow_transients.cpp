// bf16/f16 forwards on the CPU that widen only a slab at a time (linear with and without bias, elementwise ops,
// layer_norm, attention): the same values as widening everything, and the activation bytes they allocate while
// they run stay within their output plus one slab. These transients set the forward's activation peak under
// mixed precision (docs/mixed_precision.md).
#include "cpu/attention.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

namespace memtrain {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Activation bytes allocated by fn beyond what was live before it, at their peak, and fn's result.
struct Measured {
  Tensor result;
  std::size_t transient_peak = 0;
};

Measured measure(const std::function<Tensor()>& fn) {
  Allocator& alloc = Allocator::get(Device::cpu());
  CategoryGuard category(MemoryCategory::activations);
  const std::size_t before = alloc.stats()[MemoryCategory::activations].live_bytes;
  alloc.reset_peak();
  Measured m;
  m.result = fn();
  m.transient_peak = alloc.stats()[MemoryCategory::activations].peak_bytes - before;
  return m;
}

std::size_t bytes_of(const Tensor& t) { return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()); }

void expect_same_bits(const Tensor& a, const Tensor& b, std::string_view what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  EXPECT_EQ(std::memcmp(ac.data_ptr(), bc.data_ptr(), bytes_of(ac)), 0) << what << ": not bit-identical";
}

Tensor narrow_randn(const Shape& shape, DType dtype, double scale = 1.0) {
  return ops::mul(randn(shape), scale).to(dtype);
}

// y = x W^T + b in float64 from the narrow operands' exact values.
Tensor linear_f64(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor y = ops::matmul(x.to(DType::f64), w.to(DType::f64).t());
  return b.defined() ? ops::add(y, b.to(DType::f64)) : y;
}

// An [8192, 512] narrow output is 8 MiB; its f32 form would be 16 MiB, and the old path held that plus a bias
// add's two more f32 copies. Now: the output plus one f32 slab of at most 2^21 floats (8 MiB) and the bias row.
TEST(NarrowTransients, LinearHoldsOneF32SlabAndRoundsOnce) {
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const bool with_bias : {true, false}) {
      manual_seed(5);
      const Tensor x = narrow_randn({8192, 64}, dtype), w = narrow_randn({512, 64}, dtype, 0.1);
      const Tensor b = with_bias ? narrow_randn({512}, dtype) : Tensor();
      const Measured m = measure([&] { return ops::linear(x, w, b); });
      const std::string what = std::string(dtype_name(dtype)) + (with_bias ? " with bias" : " without bias");
      ASSERT_EQ(m.result.dtype(), dtype) << what;
      // f16 has no native GEMM: its weight is widened once and x one slab (2^21 / 512 rows) at a time.
      const std::size_t widened = dtype == DType::f16 ? bytes_of(w) * 2 + (std::size_t{1} << 21) / 512 * 64 * 4 : 0;
      EXPECT_LE(m.transient_peak, bytes_of(m.result) + 8 * kMiB + widened + 64 * 1024) << what;
      // Within half an ulp of the narrow type (rounded once from an f32 accumulator) of the float64 result.
      const Tensor ref = linear_f64(x, w, b), got = m.result.to(DType::f64);
      const double unit = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const double* r = ref.data<double>();
      const double* g = got.data<double>();
      for (std::int64_t i = 0; i < ref.numel(); ++i) {
        ASSERT_LE(std::abs(g[i] - r[i]), unit * std::abs(r[i]) * 1.01 + 1e-5) << what << " at " << i;
      }
    }
  }
}

TEST(NarrowTransients, ElementwiseOpsBlockAndMatchWidening) {
  for (const DType dtype : {DType::bf16, DType::f16}) {
    manual_seed(6);
    const Tensor a = narrow_randn({1024, 768}, dtype), b = narrow_randn({1024, 768}, dtype);
    const Measured sum = measure([&] { return ops::add(a, b); });
    expect_same_bits(sum.result, ops::add(a.to(DType::f32), b.to(DType::f32)).to(dtype), "add");
    EXPECT_LE(sum.transient_peak, bytes_of(sum.result) + 4096) << dtype_name(dtype);
    const Measured e = measure([&] { return ops::exp(a); });
    expect_same_bits(e.result, ops::exp(a.to(DType::f32)).to(dtype), "exp");
    EXPECT_LE(e.transient_peak, bytes_of(e.result) + 4096) << dtype_name(dtype);
  }
}

TEST(NarrowTransients, LayerNormSlabsMatchWidening) {
  for (const DType dtype : {DType::bf16, DType::f16}) {
    manual_seed(7);
    // 20000 rows of 64: about 2.4 slabs of 2^19 elements, the last one partial.
    const Tensor x = narrow_randn({2, 10000, 64}, dtype, 3.0);
    const Tensor w = ops::add(randn({64}), 1.0), bias = randn({64});
    const Measured m = measure([&] { return ops::layer_norm(x, w, bias); });
    expect_same_bits(m.result, ops::layer_norm(x.to(DType::f32), w, bias).to(dtype), dtype_name(dtype));
    const std::size_t stats = 2 * 20000 * sizeof(float), slabs = 2 * (std::size_t{1} << 19) * sizeof(float);
    EXPECT_LE(m.transient_peak, bytes_of(m.result) + stats + slabs + 4096) << dtype_name(dtype);
  }
}

TEST(NarrowTransients, AttentionWidensOneBatchElementAtATime) {
  for (const DType dtype : {DType::bf16, DType::f16}) {
    manual_seed(8);
    const std::int64_t B = 4, H = 3, T = 64, D = 32;
    // q, k, v as the head views of one fused [B, T, 3, H, D] projection, as a GPT block makes them.
    const Tensor qkv = narrow_randn({B, T, 3, H, D}, dtype);
    const Tensor q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2),
                 v = qkv.select(2, 2).transpose(1, 2);
    const Measured m = measure([&] { return ops::scaled_dot_product_attention(q, k, v); });
    const Tensor ref = ops::scaled_dot_product_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32));
    expect_same_bits(m.result, ref.to(dtype), dtype_name(dtype));
    // Output, f32 lse, the kernel's score-tile workspace, and per batch element f32 copies of q, k, v and the
    // output: 4 / B of the full f32 size.
    const std::size_t full_f32 = static_cast<std::size_t>(B * H * T * D) * sizeof(float);
    const std::size_t lse = static_cast<std::size_t>(B * H * T) * sizeof(float);
    const std::size_t tiles =
        static_cast<std::size_t>(cpu::attention_forward_workspace(T, D, omp_get_max_threads())) * sizeof(float);
    EXPECT_LE(m.transient_peak, bytes_of(m.result) + lse + tiles + 4 * full_f32 / B + 4096) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace memtrain
