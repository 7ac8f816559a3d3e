// FP8 scaling and the loss scaler on the meta device: quantize / dequantize (per tensor and blockwise), amax,
// the FP8 linear layer forward and backward under both recipes, and the loss scaler's unscale must allocate,
// per memory category, exactly the bytes they allocate on the CPU (src/cpu/fp8.cpp, src/cpu/loss_scale.cpp).
// Meta reads as zeros: an amax is 0, and the loss scaler never sees an overflow (its documented branch).
#include <gtest/gtest.h>

#include "meta_footprint.h"

#include "memtrain/amp/fp8.h"
#include "memtrain/amp/fp8_linear.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/amp/loss_scaler.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"

#include <limits>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using test_support::expect_same_footprint;

TEST(MetaAmp, Fp8QuantizationMatchesCpuBytes) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::string name(dtype_name(dtype));
    expect_same_footprint("per-tensor fp8 " + name, [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      const Tensor x = randn({20, 40}, dtype, dev);
      const Tensor q = amp::quantize_fp8(x.t(), amp::Fp8Format::e4m3, 2.0f);  // strided: a contiguous copy first
      EXPECT_EQ(q.dtype(), DType::f8_e4m3);
      const amp::Fp8WithAmax qa = amp::quantize_fp8_with_amax(x, amp::Fp8Format::e5m2, 0.5f);
      const float a = amp::amax(x);
      EXPECT_EQ(qa.amax, a);
      if (dev.is_meta()) EXPECT_EQ(a, 0.0f) << "meta reads as zeros";
      else EXPECT_GT(a, 0.0f);
      const Tensor y = amp::dequantize_fp8(qa.codes, 2.0f, DType::bf16);
      EXPECT_EQ(y.dtype(), DType::bf16);
    });
    expect_same_footprint("blockwise fp8 " + name, [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      const Tensor x = randn({130, 260}, dtype, dev);
      for (const Fp8Tiling t : {Fp8Tiling::row_1x128, Fp8Tiling::block_128x128}) {
        const amp::BlockwiseFp8 q = amp::quantize_fp8_blockwise(x, amp::Fp8Format::e4m3, t);
        EXPECT_EQ(q.inv_scales.shape(), (Shape{fp8_scale_rows(130, t), 3}));
        const Tensor y = amp::dequantize_fp8_blockwise(q);
        EXPECT_EQ(y.shape(), x.shape());
      }
    });
  }
}

TEST(MetaAmp, Fp8LinearForwardAndBackwardMatchCpuBytes) {
  for (const auto kind : {amp::Fp8ScalingKind::blockwise, amp::Fp8ScalingKind::delayed}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const std::string what = std::string(amp::fp8_scaling_name(kind)) + " " + std::string(dtype_name(dtype));
      expect_same_footprint("fp8_linear " + what, [&](Device dev) {
        amp::Fp8Recipe recipe;
        recipe.kind = kind;
        amp::Fp8LinearMeta meta;
        Tensor w, b;
        {
          CategoryGuard params(MemoryCategory::parameters);
          w = randn({24, 40}, DType::f32, dev).set_requires_grad(true);
          b = randn({24}, DType::f32, dev).set_requires_grad(true);
        }
        CategoryGuard acts(MemoryCategory::activations);
        const amp::Fp8Weight wq = amp::quantize_weight(w, recipe, &meta);
        Tensor x = randn({2, 5, 40}, dtype, dev).set_requires_grad(true);
        const Tensor y = amp::fp8_linear(x, w, wq, b, recipe, &meta);
        EXPECT_EQ(y.shape(), (Shape{2, 5, 24}));
        {
          CategoryGuard grads(MemoryCategory::gradients);
          y.backward(ones(y.shape(), y.dtype(), dev));
        }
        EXPECT_TRUE(x.grad().defined() && w.grad().defined() && b.grad().defined());
        meta.update_scales();
      });
    }
  }
}

// An Inf in one gradient: the CPU finds it and backs the scale off; meta reads zeros, so it takes the
// documented no-overflow branch. Either way the bytes are the same, a strided gradient's workspace copy included.
TEST(MetaAmp, LossScalerUnscaleMatchesCpuBytesAndNeverOverflowsOnMeta) {
  expect_same_footprint("DynamicLossScaler::unscale_", [](Device dev) {
    amp::DynamicLossScaler scaler;
    std::vector<Tensor> grads;
    {
      CategoryGuard category(MemoryCategory::gradients);
      grads = {randn({64, 48}, DType::f32, dev), randn({33}, DType::f16, dev), randn({48, 64}, DType::bf16, dev).t(),
               randn({7}, DType::f64, dev), Tensor()};
    }
    grads[1].fill_(std::numeric_limits<double>::infinity());
    const double before = scaler.scale();
    const bool finite = scaler.unscale_(grads);
    scaler.update(!finite);
    if (dev.is_meta()) {
      EXPECT_TRUE(finite);
      EXPECT_EQ(scaler.scale(), before);
    } else {
      EXPECT_FALSE(finite);
      EXPECT_LT(scaler.scale(), before);
    }
  });
}

}  // namespace
}  // namespace memtrain
