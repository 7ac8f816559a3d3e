// Uses an installed memtrain through <memtrain/memtrain.h> only, as the README shows: builds y = sum(x*x),
// runs backward, and checks the value and the gradient (2x) against plain double arithmetic, and that
// the accounting sees exactly the bytes of an allocation tagged with a category. Prints
// "memtrain consumer: ok" on success.
#include <memtrain/memtrain.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "memtrain consumer: FAILED: %s\n", what.c_str());
    ++failures;
  }
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

#ifdef MEMTRAIN_HAVE_CUDA
  std::printf("built with CUDA\n");
#endif
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
