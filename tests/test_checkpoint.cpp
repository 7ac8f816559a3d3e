// ckpt::checkpoint: gradients bit-identical to the run without it, re-runs counted, memory released.
#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

namespace memtrain {
using ops::add;
using ops::mul;

namespace {

// A small MLP block with a norm, dropout and a residual: every kind of saved tensor (params, inputs,
// matmul outputs, cheap ops' outputs, dropout's RNG state).
struct Block {
  Tensor w1, b1, w2, b2, gamma, beta;
  explicit Block(std::int64_t c) {
    w1 = mul(randn({4 * c, c}), 0.2).detach().set_requires_grad();
    b1 = mul(randn({4 * c}), 0.1).detach().set_requires_grad();
    w2 = mul(randn({c, 4 * c}), 0.2).detach().set_requires_grad();
    b2 = mul(randn({c}), 0.1).detach().set_requires_grad();
    gamma = add(mul(randn({c}), 0.1), 1.0).detach().set_requires_grad();
    beta = mul(randn({c}), 0.1).detach().set_requires_grad();
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2, gamma, beta}; }
  Tensor operator()(const Tensor& x) const {
    Tensor h = ops::layer_norm(x, gamma, beta);
    h = ops::gelu(ops::linear(h, w1, b1));
    h = ops::dropout(h, 0.25);
    h = ops::linear(h, w2, b2);
    return add(x, h);
  }
};

enum class Mode { none, full, selective };

ckpt::RegionOptions options_for(Mode m) {
  return m == Mode::selective ? ckpt::RegionOptions{ckpt::default_keep_ops(), {}} : ckpt::RegionOptions{};
}

// Runs `steps` forward/backward passes of x -> blocks -> sum(tanh) and returns the loss of each step followed
// by every gradient (of the input and of each parameter) of the last step.
std::vector<Tensor> run(Mode mode, int steps, bool nested = false) {
  manual_seed(7);
  std::vector<Block> blocks;
  for (int i = 0; i < 3; ++i) blocks.emplace_back(16);
  Tensor x0 = randn({5, 16}).set_requires_grad();
  std::vector<Tensor> out;
  for (int s = 0; s < steps; ++s) {
    for (const Block& b : blocks) autograd::zero_grad(b.params());
    x0.set_grad(Tensor());
    Tensor x = x0;
    if (nested && mode != Mode::none) {
      // The outer region holds blocks 0 and 1, each in an inner region of its own.
      x = ckpt::checkpoint(
          [&](const Tensor& in) {
            Tensor y = ckpt::checkpoint(blocks[0], in, options_for(mode));
            return ckpt::checkpoint(blocks[1], y, options_for(mode));
          },
          x, options_for(mode));
      x = blocks[2](x);
    } else {
      for (const Block& b : blocks) x = mode == Mode::none ? b(x) : ckpt::checkpoint(b, x, options_for(mode));
    }
    const Tensor loss = ops::sum(ops::tanh(x));
    loss.backward();
    out.push_back(loss.detach().clone());
  }
  out.push_back(x0.grad().clone());
  for (const Block& b : blocks) {
    for (const Tensor& p : b.params()) out.push_back(p.grad().clone());
  }
  return out;
}

void expect_bit_identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "tensor " << i;
    ASSERT_EQ(a[i].shape(), b[i].shape()) << "tensor " << i;
    const Tensor x = a[i].contiguous(), y = b[i].contiguous();
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * dtype_size(x.dtype())), 0)
        << "tensor " << i << " differs";
  }
}

TEST(Checkpoint, FullAndSelectiveGradientsBitIdenticalWithDropout) {
  const std::vector<Tensor> reference = run(Mode::none, 3);
  expect_bit_identical(run(Mode::full, 3), reference);
  expect_bit_identical(run(Mode::selective, 3), reference);
}

TEST(Checkpoint, NestedRegionsBitIdentical) {
  const std::vector<Tensor> reference = run(Mode::none, 2);
  expect_bit_identical(run(Mode::full, 2, /*nested=*/true), reference);
  expect_bit_identical(run(Mode::selective, 2, /*nested=*/true), reference);
}

TEST(Checkpoint, OneRerunPerRegionPerBackward) {
  const ckpt::Counters before = ckpt::counters();
  run(Mode::full, 2);
  const ckpt::Counters after = ckpt::counters();
  EXPECT_EQ(after.regions - before.regions, 6);
  EXPECT_EQ(after.recomputes - before.recomputes, 6);
}

// The dropout mask drawn in the re-run must be the forward's even though the default stream moved on; and
// the re-run must leave the stream where the forward left it.
TEST(Checkpoint, RerunRestoresAndPreservesTheRngStream) {
  manual_seed(3);
  Tensor x = randn({64}).set_requires_grad();
  // tanh saves its output, which the region drops: backward needs a re-run, and it must draw the same mask.
  const Tensor y = ckpt::checkpoint([](const Tensor& in) { return ops::tanh(ops::dropout(in, 0.5)); }, x);
  const RngState after_forward = get_rng_state();
  (void)randn({10});  // the stream moves on before backward
  const RngState before_backward = get_rng_state();
  ops::sum(y).backward();
  EXPECT_EQ(get_rng_state(), before_backward);
  EXPECT_NE(after_forward, before_backward);
  // d sum(tanh(dropout(x))) / dx = (1 - y^2) * 2 where the mask kept x, else 0.
  const Tensor g = x.grad(), yv = y.detach();
  for (std::int64_t i = 0; i < 64; ++i) {
    const float yi = yv.data<float>()[i];
    const float expected = yi == 0.0f ? 0.0f : (1.0f - yi * yi) * 2.0f;
    EXPECT_NEAR(g.data<float>()[i], expected, 1e-6f) << i;
  }
}

TEST(Checkpoint, InputsWithoutGradStillGiveParameterGradients) {
  manual_seed(11);
  const Block block(8);
  const Tensor x = randn({3, 8});  // needs no grad
  const Tensor plain = ops::sum(block(x));
  manual_seed(11);  // the same parameters, input and dropout draw again
  const Block block2(8);
  const Tensor x2 = randn({3, 8});
  const Tensor ck = ops::sum(ckpt::checkpoint(block2, x2));
  plain.backward();
  ck.backward();
  for (std::size_t i = 0; i < block.params().size(); ++i) {
    expect_bit_identical({block.params()[i].grad()}, {block2.params()[i].grad()});
  }
}

TEST(Checkpoint, RegionRunTwiceInOneGraph) {
  manual_seed(5);
  const Block block(8);
  Tensor x = randn({4, 8}).set_requires_grad();
  const Tensor ref = ops::sum(ops::tanh(block(block(x))));
  ref.backward();
  const Tensor gx = x.grad().clone();
  std::vector<Tensor> gp;
  for (const Tensor& p : block.params()) gp.push_back(p.grad().clone());
  autograd::zero_grad(block.params());
  x.set_grad(Tensor());

  manual_seed(5);
  const Block again(8);  // same init, same dropout draws
  Tensor x2 = randn({4, 8}).set_requires_grad();
  const Tensor ck = ops::sum(ops::tanh(ckpt::checkpoint(again, ckpt::checkpoint(again, x2))));
  ck.backward();
  expect_bit_identical({x2.grad()}, {gx});
  for (std::size_t i = 0; i < gp.size(); ++i) expect_bit_identical({again.params()[i].grad()}, {gp[i]});
}

// The block's second linear saves its input (the last tensor the region drops) before it multiplies, so the
// re-run stops there: full recomputes the first projection only, selective (which keeps its output) nothing.
TEST(Checkpoint, RerunStopsBeforeTheLastProjection) {
  const std::int64_t rows = 5, c = 16;
  const double first_projection = 2.0 * rows * (4 * c) * c;
  for (const Mode mode : {Mode::full, Mode::selective}) {
    manual_seed(3);
    const Block block(c);
    const Tensor x = randn({rows, c}).set_requires_grad();
    const ckpt::Counters before = ckpt::counters();
    ckpt::RegionProfile profile;
    ops::sum(ckpt::checkpoint(block, x, options_for(mode), &profile)).backward();
    const ckpt::Counters after = ckpt::counters();
    const double recomputed = after.recomputed_flops - before.recomputed_flops;
    EXPECT_EQ(after.recomputes - before.recomputes, 1);
    EXPECT_EQ(recomputed, mode == Mode::full ? first_projection : 0.0) << (mode == Mode::full ? "full" : "selective");
    // The profile (what the budget planner prices) predicts what the re-run did.
    EXPECT_EQ(mode == Mode::full ? profile.full_rerun_flops : profile.unsaved_expensive_flops, recomputed);
  }
}

TEST(Checkpoint, UnusedOutputIsNeverRerunAndFreesEverything) {
  manual_seed(2);
  const Block block(8);
  Tensor x = randn({4, 8}).set_requires_grad();
  const std::size_t baseline = Allocator::get(Device::cpu()).stats().live_bytes;
  const ckpt::Counters before = ckpt::counters();
  {
    const Tensor unused = ckpt::checkpoint(block, x);
    const Tensor used = ckpt::checkpoint(block, x);
    ops::sum(used).backward();
  }
  EXPECT_EQ(ckpt::counters().recomputes - before.recomputes, 1);
  autograd::zero_grad(block.params());
  x.set_grad(Tensor());
  EXPECT_EQ(Allocator::get(Device::cpu()).stats().live_bytes, baseline);
}

TEST(Checkpoint, ExceptionInsideRegionLeaksNothing) {
  manual_seed(4);
  const Block block(8);
  Tensor x = randn({4, 8}).set_requires_grad();
  const std::size_t baseline = Allocator::get(Device::cpu()).stats().live_bytes;
  EXPECT_THROW(ckpt::checkpoint(
                   [&](const Tensor& in) {
                     const Tensor h = block(in);
                     (void)h;
                     throw std::runtime_error("boom");
                     return h;
                   },
                   x),
               std::runtime_error);
  EXPECT_EQ(Allocator::get(Device::cpu()).stats().live_bytes, baseline);
}

TEST(Checkpoint, RetainGraphAllowsASecondBackward) {
  manual_seed(8);
  const Block block(8);
  Tensor x = randn({4, 8}).set_requires_grad();
  const Tensor loss = ops::sum(ops::tanh(ckpt::checkpoint(block, x)));
  loss.backward(Tensor(), /*retain_graph=*/true);
  const Tensor first = x.grad().clone();
  x.set_grad(Tensor());
  loss.backward();
  expect_bit_identical({x.grad()}, {first});
}

TEST(Checkpoint, FullDropsMoreThanSelectiveAndReportsIt) {
  manual_seed(6);
  const Block block(32);
  Tensor x = randn({64, 32}).set_requires_grad();
  ckpt::RegionProfile full, selective;
  const Tensor a = ckpt::checkpoint(block, x, {}, &full);
  const Tensor b = ckpt::checkpoint(block, x, ckpt::RegionOptions{ckpt::default_keep_ops(), {}}, &selective);
  const std::size_t row = 64 * 32 * sizeof(float);
  EXPECT_EQ(full.input_bytes, row);
  // Both see the same saved tensors; full drops all of them, selective keeps the two linear outputs.
  EXPECT_EQ(full.saved_bytes, selective.saved_bytes);
  EXPECT_EQ(full.dropped_bytes, full.saved_bytes);
  EXPECT_LT(selective.dropped_bytes, full.dropped_bytes);
  // The fc output [64, 128] is saved (by gelu); the proj output [64, 32] feeds the residual add, which saves
  // nothing, so it is not counted and selective lets it go. The proj runs after the region's last save (its
  // input), so no re-run computes it again: full redoes the fc only, selective nothing.
  EXPECT_EQ(full.expensive_bytes, 4 * row);
  EXPECT_DOUBLE_EQ(full.unsaved_expensive_flops, 0.0);
  EXPECT_EQ(selective.cheap_saved_bytes, selective.dropped_bytes);
  EXPECT_DOUBLE_EQ(full.expensive_flops, 2.0 * 64 * 32 * 128 * 2);
  EXPECT_DOUBLE_EQ(full.full_rerun_flops, 2.0 * 64 * 32 * 128);
}

TEST(Checkpoint, FunctionThatChangesOnRerunIsCaught) {
  manual_seed(9);
  const Tensor w = randn({8, 8}).set_requires_grad();
  Tensor x = randn({4, 8}).set_requires_grad();
  int calls = 0;
  const Tensor y = ckpt::checkpoint(
      [&](const Tensor& in) {
        ++calls;
        const Tensor h = ops::matmul(in, w);
        return calls == 1 ? ops::tanh(h) : ops::tanh(ops::sum(h, {0}));  // the re-run saves another shape
      },
      x);
  (void)calls;
  try {
    ops::sum(ops::tanh(y)).backward();
    FAIL() << "expected a mismatch error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt::checkpoint"), std::string::npos) << e.what();
  }
}

// Selective regions hand the kept outputs of expensive ops back to the re-run instead of recomputing them;
// an output that no op saved is let go after the forward and recomputed.
TEST(Checkpoint, SelectiveReRunReplaysKeptOpsInsteadOfComputing) {
  for (const bool selective : {false, true}) {
    for (const bool output_saved : {true, false}) {
      int computed = 0;
      const Tensor x = randn({4, 4}).set_requires_grad();
      const auto fn = [&](const Tensor& in) {
        // An op built like matmul: compute (or replay) without a graph, then record its own node.
        const Tensor h = ckpt::detail::compute_or_replay("costly", 1.0, [&] {
          ++computed;
          autograd::NoGradGuard no_grad;
          return std::vector<Tensor>{ops::mul(in, 3.0)};
        })[0];
        autograd::record("costly", {in}, {h},
                         [](const std::vector<Tensor>& g) { return std::vector<Tensor>{ops::mul(g[0], 3.0)}; });
        // mul saves h; tanh saves only its output. Either way a dropped tensor makes backward re-run.
        return output_saved ? ops::tanh(ops::mul(h, h)) : ops::tanh(ops::add(h, 1.0));
      };
      const ckpt::RegionOptions options{selective ? std::vector<std::string>{"costly"} : std::vector<std::string>{},
                                        {}};
      ops::sum(ckpt::checkpoint(fn, x, options)).backward();
      EXPECT_EQ(computed, selective && output_saved ? 1 : 2)
          << (selective ? "selective" : "full") << (output_saved ? ", output saved" : ", output not saved");
    }
  }
}

TEST(Checkpoint, NoGradModeJustRunsTheFunction) {
  autograd::NoGradGuard no_grad;
  const Tensor x = randn({3, 3});
  const ckpt::Counters before = ckpt::counters();
  const Tensor y = ckpt::checkpoint([](const Tensor& in) { return ops::tanh(in); }, x);
  EXPECT_EQ(ckpt::counters().regions, before.regions);
  EXPECT_FALSE(y.requires_grad());
}

}  // namespace
}  // namespace memtrain
