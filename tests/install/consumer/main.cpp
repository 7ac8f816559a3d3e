// Uses an installed memtrain through <memtrain/memtrain.h> only, as the README shows: builds y = sum(x*x),
// runs backward, and checks the value and the gradient (2x) against plain double arithmetic, and that
// the accounting sees exactly the bytes of an allocation tagged with a category. Then touches the parts of
// the public surface that only the umbrella header brings in (fused loss, 8-bit optimizers, GaLore,
// block-wise quantized state), so a header dropped from memtrain.h fails this build. Prints
// "memtrain consumer: ok" on success.
#include <memtrain/memtrain.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "memtrain consumer: FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// ops/fused_loss.h: equals cross_entropy(linear(x, w)) with a chunk smaller than the batch.
void check_fused_loss() {
  namespace ops = memtrain::ops;
  const memtrain::Tensor x = memtrain::randn({6, 8});
  const memtrain::Tensor w = memtrain::randn({5, 8});
  const memtrain::Tensor targets = memtrain::tensor<std::int64_t>({0, 4, 2, 1, 3, 4}, {6});
  const double fused =
      ops::fused_linear_cross_entropy(x, w, memtrain::Tensor(), targets, ops::Reduction::mean, -100, 4).item();
  const double plain = ops::cross_entropy(ops::linear(x, w), targets).item();
  expect(std::abs(fused - plain) <= 1e-5 * (1.0 + std::abs(plain)), "fused_linear_cross_entropy == cross_entropy(linear)");
}

// How many elements of p one step moves, with gradient 2p (from sum(p*p)).
std::int64_t moved_by_step(memtrain::optim::Optimizer& opt, memtrain::Tensor& p) {
  const memtrain::Tensor old = p.detach().clone();
  memtrain::ops::sum(memtrain::ops::mul(p, p)).backward();
  opt.step();
  std::int64_t moved = 0;
  for (std::int64_t i = 0; i < p.numel(); ++i) moved += old.data<float>()[i] != p.data<float>()[i];
  return moved;
}

// optim/adamw8bit.h, optim/lion8bit.h: 8-bit block-wise state of exactly the documented size.
void check_8bit_optimizers() {
  namespace optim = memtrain::optim;
  constexpr std::int64_t n = 300, block = 64, blocks = (n + block - 1) / block;
  memtrain::Tensor p = memtrain::randn({n}).set_requires_grad(true);
  optim::AdamW8bit adamw({optim::ParamGroup{{p}, 1e-2}}, block, /*min_8bit_size=*/1);
  expect(moved_by_step(adamw, p) > n / 2, "AdamW8bit moves the parameters");
  expect(adamw.state_bytes() == 2 * n + 8 * blocks, "AdamW8bit state is 2n + 8 ceil(n/block) bytes");

  memtrain::Tensor q = memtrain::randn({n}).set_requires_grad(true);
  optim::Lion8bit lion({optim::ParamGroup{{q}, 1e-2}}, block, /*min_8bit_size=*/1);
  expect(moved_by_step(lion, q) > n / 2, "Lion8bit moves the parameters");
  expect(lion.state_bytes() == n + 4 * blocks, "Lion8bit state is n + 4 ceil(n/block) bytes");
}

// optim/galore.h (and galore_projector.h): a 2-D weight stepped through a rank-2 projection.
void check_galore() {
  namespace optim = memtrain::optim;
  memtrain::Tensor wt = memtrain::randn({8, 6}).set_requires_grad(true);
  optim::GaLoreSpec spec;
  spec.rank = 2;
  spec.svd = optim::GaLoreSvd::exact;
  optim::GaLoreGroups groups;
  groups.projected.push_back(optim::ParamGroup{{wt}, 1e-2});
  optim::GaLore galore(optim::Spec::adamw(), spec, std::move(groups));
  const memtrain::Tensor old = wt.detach().clone();
  memtrain::ops::sum(memtrain::ops::mul(wt, wt)).backward();
  galore.step();
  expect(galore.is_projected(wt) && galore.projector(wt) != nullptr, "GaLore projects the 2-D weight");
  expect(galore.projector_bytes() > 0, "GaLore keeps a basis");
  bool changed = false;
  for (std::int64_t i = 0; i < wt.numel(); ++i) changed |= old.data<float>()[i] != wt.data<float>()[i];
  expect(changed, "GaLore steps the weight");
}

// optim/quantized_state.h: a round trip through 8-bit codes stays within the map's resolution.
void check_quantized_state() {
  namespace optim = memtrain::optim;
  expect(optim::dynamic_map(optim::QuantMap::signed_dynamic)[255] == 1.0f, "the signed map ends at 1");
  constexpr std::int64_t n = 200;
  const memtrain::Tensor src = memtrain::randn({n});
  optim::QuantizedState state(n, optim::QuantMap::signed_dynamic, 64);
  state.quantize(src.data<float>());
  std::vector<float> back(n);
  state.dequantize(back.data());
  float absmax = 0.0f, worst = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    absmax = std::max(absmax, std::abs(src.data<float>()[i]));
    worst = std::max(worst, std::abs(back[i] - src.data<float>()[i]));
  }
  expect(state.num_blocks() == 4 && state.nbytes() == n + 4 * 4, "quantized state: n codes + one f32 per block");
  expect(worst <= 0.05f * absmax, "quantized state round trip within 5% of absmax");
}

int run() {
  // The README example.
  memtrain::Tensor x = memtrain::randn({4, 8}, memtrain::DType::f32).set_requires_grad(true);
  auto y = memtrain::ops::sum(memtrain::ops::mul(x, x));
  y.backward();
  std::cout << x.grad() << memtrain::memory_report();

  const float* xs = x.data<float>();
  double expected = 0.0;
  for (int i = 0; i < 32; ++i) expected += static_cast<double>(xs[i]) * xs[i];
  expect(std::abs(y.item() - expected) <= 1e-5 * (1.0 + expected), "sum(x*x) matches double arithmetic");
  const memtrain::Tensor g = x.grad();
  expect(g.defined() && g.numel() == 32 && g.is_contiguous(), "x.grad() has x's shape");
  if (g.defined() && g.numel() == 32) {
    const float* gs = g.contiguous().data<float>();
    for (int i = 0; i < 32; ++i) {
      expect(std::abs(gs[i] - 2.0f * xs[i]) <= 1e-6f * (1.0f + std::abs(xs[i])), "grad[" + std::to_string(i) + "] == 2x");
    }
  }
  std::ostringstream printed;
  printed << g;
  expect(!printed.str().empty(), "a tensor prints");

  // Accounting: exactly the bytes asked for, in the category of the innermost guard.
  using memtrain::MemoryCategory;
  const std::size_t before = memtrain::memory_stats()[MemoryCategory::parameters].live_bytes;
  memtrain::Tensor w;
  {
    memtrain::CategoryGuard guard(MemoryCategory::parameters);
    w = memtrain::Tensor::empty({10, 25}, memtrain::DType::f32);
  }
  expect(memtrain::memory_stats()[MemoryCategory::parameters].live_bytes == before + 1000,
         "a 10x25 f32 parameter counts 1000 bytes");
  expect(memtrain::memory_report().find("parameters") != std::string::npos,
         "the report names the parameters category");
  w = memtrain::Tensor();
  expect(memtrain::memory_stats()[MemoryCategory::parameters].live_bytes == before,
         "releasing the tensor returns its bytes");

  check_fused_loss();
  check_8bit_optimizers();
  check_galore();
  check_quantized_state();

  // The CUDA module is found (or not) at run time; the install check reads this line. It hides the module
  // in one run and expects the reason to name it.
  std::printf("cuda: built %s, available %s, reason: %s\n", memtrain::cuda::built_with_cuda() ? "yes" : "no",
              memtrain::cuda::is_available() ? "yes" : "no", memtrain::cuda::unavailable_reason().c_str());
#ifdef MEMTRAIN_CONSUMER_EXPECT_CUDA
  expect(memtrain::cuda::built_with_cuda() == (MEMTRAIN_CONSUMER_EXPECT_CUDA != 0),
         "cuda::built_with_cuda() says what the package was built with");
#endif
  expect(memtrain::cuda::is_available() || !memtrain::cuda::unavailable_reason().empty(),
         "an unusable CUDA comes with a reason");
  if (failures != 0) return 1;
  std::printf("memtrain consumer: ok\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memtrain consumer: FAILED: exception: %s\n", e.what());
    return 1;
  }
}
