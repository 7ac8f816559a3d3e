// ops/dispatch_modes.h: the ops consult the CastMode and RecomputeMode installed on their thread, and nothing
// else; guards nest; the backward engine suspends casting; amp::Autocast and ckpt::checkpoint reach the ops
// through these modes only.
#include "memtrain/amp/autocast.h"
#include "memtrain/autograd/engine.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/core/rng.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace memtrain {
namespace {

// Casts every floating input of a low-precision op to f16 and counts what the ops asked.
class CountingCast final : public ops::CastMode {
 public:
  int to_compute_calls = 0, to_f32_calls = 0, linear_calls = 0;
  std::optional<std::vector<Tensor>> to_compute(const std::vector<Tensor>& inputs) override {
    ++to_compute_calls;
    bool changed = false;
    std::vector<Tensor> out;
    for (const Tensor& t : inputs) {
      const bool cast = t.defined() && t.dtype() == DType::f32;
      changed |= cast;
      out.push_back(cast ? t.to(DType::f16) : t);
    }
    if (!changed) return std::nullopt;
    return out;
  }
  std::optional<std::vector<Tensor>> to_f32(const std::vector<Tensor>&) override {
    ++to_f32_calls;
    return std::nullopt;
  }
  std::optional<Tensor> linear(const Tensor&, const Tensor&, const Tensor&) override {
    ++linear_calls;
    return std::nullopt;
  }
};

// Records the ops that hand their forward over, and computes them.
class RecordingRecompute final : public ops::RecomputeMode {
 public:
  std::vector<std::string> ops;
  std::vector<Tensor> compute_or_replay(std::string_view op, double flops,
                                        const std::function<std::vector<Tensor>()>& compute) override {
    ops.emplace_back(op);
    EXPECT_GT(flops, 0.0) << op;
    return compute();
  }
};

TEST(DispatchModes, NoModeIsInstalledByDefault) {
  EXPECT_EQ(ops::detail::current_cast_mode(), nullptr);
  EXPECT_EQ(ops::detail::current_recompute_mode(), nullptr);
}

TEST(DispatchModes, OpsConsultTheInstalledCastModeAndGuardsNest) {
  manual_seed(3);
  const Tensor x = randn({4, 8}), w = randn({3, 8});
  CountingCast outer, inner;
  {
    ops::CastModeGuard g1(&outer);
    EXPECT_EQ(ops::detail::current_cast_mode(), &outer);
    EXPECT_EQ(ops::linear(x, w).dtype(), DType::f16);
    // Asked twice: by linear, and by linear again on the inputs the mode cast (it then declines both times).
    EXPECT_EQ(outer.linear_calls, 2);
    {
      ops::CastModeGuard g2(&inner);
      EXPECT_EQ(ops::detail::current_cast_mode(), &inner);
      (void)ops::softmax(x, -1);
      EXPECT_EQ(inner.to_f32_calls, 1);
      ops::CastModeGuard off(nullptr);  // suspends casting: ops run as called
      EXPECT_EQ(ops::matmul(x, w.t()).dtype(), DType::f32);
    }
    EXPECT_EQ(ops::detail::current_cast_mode(), &outer);
    EXPECT_EQ(inner.to_compute_calls, 0);
  }
  EXPECT_EQ(ops::detail::current_cast_mode(), nullptr);
  EXPECT_EQ(ops::linear(x, w).dtype(), DType::f32);
  EXPECT_EQ(outer.linear_calls, 2);
}

TEST(DispatchModes, BackwardRunsWithCastingSuspended) {
  manual_seed(4);
  Tensor w = randn({3, 8}).set_requires_grad();
  const Tensor x = randn({4, 8});
  CountingCast mode;
  ops::CastModeGuard guard(&mode);
  const Tensor y = ops::linear(x, w);  // f16: the mode cast x and w
  EXPECT_EQ(y.dtype(), DType::f16);
  const int before = mode.to_compute_calls;
  ops::sum(y.to(DType::f32)).backward();  // its matmuls would ask the mode if the engine did not suspend it
  EXPECT_EQ(mode.to_compute_calls, before);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(ops::detail::current_cast_mode(), &mode);  // restored after backward
}

TEST(DispatchModes, AutocastInstallsACastModeOnItsOwnThreadOnly) {
  EXPECT_EQ(ops::detail::current_cast_mode(), nullptr);
  {
    amp::Autocast bf16(DType::bf16);
    ops::CastMode* installed = ops::detail::current_cast_mode();
    ASSERT_NE(installed, nullptr);
    ops::CastMode* seen_by_other_thread = installed;
    DType dtype_on_other_thread = DType::bf16;
    std::thread other([&] {
      seen_by_other_thread = ops::detail::current_cast_mode();
      dtype_on_other_thread = amp::autocast_dtype();
    });
    other.join();
    EXPECT_EQ(seen_by_other_thread, nullptr);
    EXPECT_EQ(dtype_on_other_thread, DType::f32);
    {
      amp::Autocast off(DType::f32);  // autocast off: no mode, as with no guard at all
      EXPECT_EQ(ops::detail::current_cast_mode(), nullptr);
      EXPECT_FALSE(amp::autocast_enabled());
    }
    EXPECT_EQ(ops::detail::current_cast_mode(), installed);
    EXPECT_EQ(amp::autocast_dtype(), DType::bf16);
    ops::CastModeGuard suspended(nullptr);  // what the engine does: amp sees autocast off too
    EXPECT_EQ(amp::autocast_dtype(), DType::f32);
  }
  EXPECT_EQ(ops::detail::current_cast_mode(), nullptr);
}

TEST(DispatchModes, ExpensiveOpsHandTheirForwardToTheRecomputeMode) {
  manual_seed(5);
  const Tensor x = randn({2, 2, 4, 8}), w = randn({6, 8}), b = randn({6});
  RecordingRecompute mode;
  {
    ops::RecomputeModeGuard guard(&mode);
    (void)ops::matmul(x.reshape({16, 8}), w.t());
    (void)ops::linear(x.reshape({16, 8}), w, b);
    (void)ops::scaled_dot_product_attention(x, x, x, true);
    (void)ops::add(x, x);  // cheap: computed directly
  }
  (void)ops::matmul(x.reshape({16, 8}), w.t());  // no mode any more
  EXPECT_EQ(mode.ops, (std::vector<std::string>{"matmul", "linear", "scaled_dot_product_attention"}));
}

TEST(DispatchModes, ACheckpointRegionIsTheRecomputeModeOfItsForward) {
  manual_seed(6);
  Tensor x = randn({4, 8}).set_requires_grad();
  const Tensor w = randn({8, 8});
  ops::RecomputeMode* during = nullptr;
  const Tensor y = ckpt::checkpoint(
      [&](const Tensor& in) {
        during = ops::detail::current_recompute_mode();
        return ops::matmul(in, w);
      },
      x);
  EXPECT_NE(during, nullptr);
  EXPECT_EQ(ops::detail::current_recompute_mode(), nullptr);
  const std::int64_t recomputes = ckpt::counters().recomputes;
  ops::sum(y).backward();  // w was dropped: the re-run installs the region again, then restores none
  EXPECT_EQ(ckpt::counters().recomputes, recomputes + 1);
  EXPECT_EQ(ops::detail::current_recompute_mode(), nullptr);
  EXPECT_TRUE(x.grad().defined());
}

}  // namespace
}  // namespace memtrain
