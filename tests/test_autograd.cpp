// Autograd engine: backward from scalars and with given gradients, grad modes, retain_graph, accumulation,
// zero_grad, gradient-ready hooks, the saved-tensor door, and activation memory falling during backward.
#include "memtrain/memtrain.h"

#include <gtest/gtest.h>

using namespace memtrain;
using namespace memtrain::ops;

namespace {

std::vector<double> values(const Tensor& t) {
  const Tensor c = t.detach().contiguous().to(DType::f64);
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

TEST(Autograd, ProductRuleAndBroadcastingBackward) {
  Tensor a = tensor({1.0, 2.0, 3.0}, {3}).set_requires_grad();
  Tensor b = tensor({4.0, 5.0}, {2, 1}).set_requires_grad();
  Tensor y = sum(mul(a, b) + a);  // y = sum_ij a_j b_i + a_j
  y.backward();
  EXPECT_EQ(values(a.grad()), (std::vector<double>{11, 11, 11}));  // b0 + b1 + 2 (two rows of +a)
  EXPECT_EQ(values(b.grad()), (std::vector<double>{6, 6}));        // sum_j a_j
  EXPECT_TRUE(a.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_NE(y.grad_fn(), nullptr);
}

TEST(Autograd, BackwardWithAGivenGradient) {
  Tensor x = tensor({1.0, 2.0}, {2}).set_requires_grad();
  Tensor y = mul(x, x);
  y.backward(tensor({1.0, 10.0}, {2}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2, 40}));
  Tensor z = mul(x, 2.0);
  EXPECT_THROW(z.backward(), Error);  // non-scalar root needs a gradient
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCallsUntilZeroed) {
  Tensor x = tensor({3.0}, {1}).set_requires_grad();
  sum(mul(x, x)).backward();
  sum(mul(x, x)).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{12}));
  autograd::zero_grad({x}, /*set_to_none=*/false);
  EXPECT_EQ(values(x.grad()), (std::vector<double>{0}));
  autograd::zero_grad({x});
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = ones({2}).set_requires_grad();
  Tensor y;
  {
    autograd::NoGradGuard guard;
    y = mul(x, x);
    {
      autograd::EnableGradGuard enable;
      EXPECT_TRUE(mul(x, x).requires_grad());
    }
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_TRUE(autograd::grad_enabled());
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = tensor({2.0}, {1}).set_requires_grad();
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{8}));
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Autograd, BackwardFromATensorThatNeedsNoGradThrows) {
  Tensor x = ones({1});
  EXPECT_THROW(sum(x).backward(), Error);
}

TEST(Autograd, GradReadyHookFiresOnceWithTheFinalGradient) {
  Tensor x = tensor({1.0, 2.0}, {2}).set_requires_grad();
  int calls = 0;
  std::vector<double> seen;
  x.register_grad_ready_hook([&](Tensor& p) {
    ++calls;
    seen = values(p.grad());
  });
  // x is used three times; the hook must see the sum of all three contributions.
  Tensor y = sum(mul(x, x) + mul(x, 3.0));
  y.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{5, 7}));  // 2x + 3
}

TEST(Autograd, HookCanConsumeAndFreeTheGradient) {
  // Layer-wise updates: the hook applies the gradient and frees it, so gradient bytes return to baseline.
  Tensor w;
  {
    CategoryGuard g(MemoryCategory::parameters);
    w = ones({256}).set_requires_grad();
  }
  const std::size_t grads0 = memory_stats()[MemoryCategory::gradients].live_bytes;
  double applied = 0;
  w.register_grad_ready_hook([&](Tensor& p) {
    applied = sum(p.grad()).item();
    p.set_grad(Tensor());
  });
  sum(mul(w, 2.0)).backward();
  EXPECT_DOUBLE_EQ(applied, 512.0);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(memory_stats()[MemoryCategory::gradients].live_bytes, grads0);
}

TEST(Autograd, SavedTensorsAreReleasedAsTheirNodesRun) {
  // h_i = h_{i-1} * h_{i-1}: mul_i saves h_{i-1}. A probe node after h_4 reads the accounting when backward
  // reaches it: by then muls 5..8 have run and freed what they saved.
  const std::int64_t n = 1024;
  const std::size_t bytes = n * sizeof(float);
  Tensor x;
  {
    CategoryGuard g(MemoryCategory::parameters);
    x = full({n}, 1.0001).set_requires_grad();
  }
  auto activations = [] { return memory_stats()[MemoryCategory::activations].live_bytes; };
  const std::size_t base = activations();
  std::size_t at_probe = 0;
  Tensor loss;
  {
    CategoryGuard g(MemoryCategory::activations);
    Tensor h = x;
    for (int i = 1; i <= 8; ++i) {
      h = mul(h, h);
      if (i == 4) {
        Tensor probed = h.detach();
        autograd::record("probe", {h}, {probed}, [&](const std::vector<Tensor>& grad) {
          at_probe = activations();
          return grad;
        });
        h = probed;
      }
    }
    loss = sum(h);
  }
  // Live now: h_1..h_7 (saved by muls 2..8) and the scalar loss; h_8 was only referenced by the dropped `h`.
  EXPECT_EQ(activations() - base, 7 * bytes + sizeof(float));
  loss.backward();
  EXPECT_EQ(at_probe - base, 3 * bytes + sizeof(float));  // only h_1..h_3 remain
  EXPECT_EQ(activations() - base, sizeof(float));
}

// A door-keeper that counts what passes and keeps tensors in a side table.
class CountingHooks : public autograd::SavedTensorHooks {
 public:
  std::shared_ptr<void> pack(const Tensor& t) override {
    ++packed;
    return std::make_shared<Tensor>(t);
  }
  Tensor unpack(const std::shared_ptr<void>& handle) override {
    ++unpacked;
    return *std::static_pointer_cast<Tensor>(handle);
  }
  int packed = 0, unpacked = 0;
};

TEST(Autograd, EverySavedTensorPassesThroughTheHooks) {
  auto hooks = std::make_shared<CountingHooks>();
  Tensor a = randn({3, 4}).set_requires_grad(), b = randn({4, 2}).set_requires_grad();
  Tensor y;
  {
    autograd::SavedTensorHooksGuard guard(hooks);
    y = sum(mul(matmul(a, b), 2.0));
  }
  EXPECT_EQ(hooks->packed, 2);  // matmul saves a and b; mul by a scalar saves nothing
  y.backward();
  EXPECT_EQ(hooks->unpacked, 2);
  EXPECT_EQ(autograd::current_saved_tensor_hooks(), nullptr);
}

TEST(Autograd, MatmulGradientsMatchTheClosedForm) {
  // d(sum(A B))/dA = 1 B^T, /dB = A^T 1, checked in float64 against direct sums.
  Tensor a = randn({3, 4}, DType::f64).set_requires_grad();
  Tensor b = randn({4, 5}, DType::f64).set_requires_grad();
  sum(matmul(a, b)).backward();
  const auto av = values(a), bv = values(b), ga = values(a.grad()), gb = values(b.grad());
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 4; ++k) {
      double s = 0;
      for (int j = 0; j < 5; ++j) s += bv[k * 5 + j];
      EXPECT_NEAR(ga[i * 4 + k], s, 1e-12);
    }
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 5; ++j) {
      double s = 0;
      for (int i = 0; i < 3; ++i) s += av[i * 4 + k];
      EXPECT_NEAR(gb[k * 5 + j], s, 1e-12);
    }
}

TEST(Autograd, BatchedMatmulAndLinearShapes) {
  Tensor x = randn({2, 3, 4}).set_requires_grad();
  Tensor w = randn({5, 4}).set_requires_grad();
  Tensor bias = randn({5}).set_requires_grad();
  Tensor y = linear(x, w, bias);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  sum(y).backward();
  EXPECT_EQ(w.grad().shape(), (Shape{5, 4}));
  EXPECT_EQ(values(bias.grad()), (std::vector<double>(5, 6.0)));  // 2 * 3 rows each
  Tensor q = randn({2, 3, 4}).set_requires_grad(), k = randn({2, 4, 6}).set_requires_grad();
  Tensor s = matmul(q, k);
  EXPECT_EQ(s.shape(), (Shape{2, 3, 6}));
  sum(s).backward();
  EXPECT_EQ(k.grad().shape(), (Shape{2, 4, 6}));
  EXPECT_THROW(matmul(randn({2, 3}), randn({4, 2})), Error);
  EXPECT_THROW(matmul(randn({2, 3}), randn({3, 2}, DType::f64)), Error);
}

// A node whose backward ignores its output's gradient and hands `grad_of_input` to its one input x.
Tensor constant_grad_node(const char* name, const Tensor& x, const std::function<Tensor()>& grad_of_input) {
  Tensor out = zeros({});
  autograd::record(name, {x}, {out}, [grad_of_input](const std::vector<Tensor>&) {
    return std::vector<Tensor>{grad_of_input()};
  });
  return out;
}

TEST(Autograd, ASecondContributionIsAddedIntoTheFirstInPlace) {
  // x gets two full-size gradients (a tied weight's head and embedding): the engine adds the second into the
  // first, so at most two such tensors are alive during backward, not the two plus their sum.
  const std::int64_t n = 1 << 16;
  const std::size_t bytes = n * sizeof(float);
  Tensor x = zeros({n}).set_requires_grad();
  const Tensor a = constant_grad_node("a", x, [n] { return full({n}, 1.0); });
  const Tensor b = constant_grad_node("b", x, [n] { return full({n}, 2.0); });
  Allocator& cpu = Allocator::get(Device::cpu());
  const std::size_t before = cpu.stats()[MemoryCategory::gradients].live_bytes;
  cpu.reset_peak();
  autograd::backward({a, b}, {full({}, 1.0), full({}, 1.0)});
  const std::size_t peak = cpu.stats()[MemoryCategory::gradients].peak_bytes - before;
  EXPECT_LE(peak, 2 * bytes + 1024) << "a third full gradient was alive";
  EXPECT_EQ(values(x.grad()), std::vector<double>(n, 3.0));
}

TEST(Autograd, AGradientHandedToTwoInputsIsNeverChangedInPlace) {
  // "both" hands one tensor to x and to "pass" (which hands it on to y); "more" adds into x's gradient before
  // "pass" runs, and that must not show up in y's.
  Tensor x = zeros({4}).set_requires_grad(), y = zeros({4}).set_requires_grad();
  Tensor passed = zeros({4});
  autograd::record("pass", {y}, {passed}, [](const std::vector<Tensor>& g) { return g; });
  const Tensor more = constant_grad_node("more", x, [] { return full({4}, 5.0); });
  Tensor both = zeros({});
  autograd::record("both", {x, passed}, {both}, [](const std::vector<Tensor>&) {
    const Tensor shared = full({4}, 1.0);
    return std::vector<Tensor>{shared, shared};
  });
  autograd::backward({more, both}, {full({}, 1.0), full({}, 1.0)});  // newest first: both, more, pass
  EXPECT_EQ(values(x.grad()), std::vector<double>(4, 6.0));
  EXPECT_EQ(values(y.grad()), std::vector<double>(4, 1.0));
}

TEST(Autograd, AnEmbeddingScattersIntoItsTiedWeightsGatheredGradient) {
  // W [V, C] is both the embedding table and the head (logits = linear(e, W)): the head's dW is gathered first and the
  // embedding's rows are added into it, so no second dense [V, C] gradient is made. Gradients equal those of
  // two untied copies, summed.
  const std::int64_t V = 4096, C = 64, N = 16;
  const std::size_t table_bytes = V * C * sizeof(float);
  manual_seed(3);
  std::vector<std::int64_t> ids(N);
  for (std::int64_t i = 0; i < N; ++i) ids[static_cast<std::size_t>(i)] = (i * 977 + 5) % V;  // one repeat below
  ids[7] = ids[3];
  const Tensor w0 = randn({V, C}), idx = tensor(ids, {N}), up = randn({N, V});
  Tensor w = w0.detach().clone().set_requires_grad();
  const Tensor logits = linear(embedding(w, idx), w, Tensor());  // (N, V)
  Allocator& cpu = Allocator::get(Device::cpu());
  const std::size_t before = cpu.stats()[MemoryCategory::gradients].live_bytes;
  cpu.reset_peak();
  logits.backward(up);
  const std::size_t peak = cpu.stats()[MemoryCategory::gradients].peak_bytes - before;
  EXPECT_LT(peak, table_bytes + table_bytes / 2) << "a second [V, C] gradient was alive";

  Tensor a = w0.detach().clone().set_requires_grad(), b = w0.detach().clone().set_requires_grad();
  linear(embedding(a, idx), b, Tensor()).backward(up);
  const std::vector<double> got = values(w.grad()), want_a = values(a.grad()), want_b = values(b.grad());
  for (std::size_t i = 0; i < got.size(); ++i) {
    // f32 GEMM sums, possibly blocked differently, and the rows added in another order
    const double scale = std::abs(want_a[i]) + std::abs(want_b[i]) + 1.0;
    ASSERT_NEAR(got[i], want_a[i] + want_b[i], 1e-5 * scale) << i;
  }
}

}  // namespace
