// Gradient clipping by global L2 norm. The sum of squares runs in double: over ~1e8 fp32 terms a float
// accumulator would lose the small gradients entirely.
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/train/trainer.h"

#include <cmath>

namespace memtrain::train {

namespace {

double sum_of_squares(const Tensor& grad) {
  // Reads f32/f64 CPU contiguous gradients in place; anything else (other dtype, device, layout) is
  // converted to a contiguous fp32 CPU copy first.
  if (grad.device().is_cpu() && grad.is_contiguous() && grad.dtype() == DType::f64) {
    const double* p = grad.data<double>();
    const std::int64_t n = grad.numel();
    double acc = 0.0;
#pragma omp parallel for reduction(+ : acc) schedule(static) if (n > 32768)
    for (std::int64_t i = 0; i < n; ++i) acc += p[i] * p[i];
    return acc;
  }
  Tensor g = grad;
  if (!(g.device().is_cpu() && g.is_contiguous() && g.dtype() == DType::f32)) {
    CategoryGuard category(MemoryCategory::workspace);
    g = g.to(Device::cpu()).to(DType::f32).contiguous();
  }
  const float* p = g.data<float>();
  const std::int64_t n = g.numel();
  double acc = 0.0;
#pragma omp parallel for reduction(+ : acc) schedule(static) if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  return acc;
}

}  // namespace

double global_grad_norm(const std::vector<Tensor>& params) {
  autograd::NoGradGuard no_grad;
  double total = 0.0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) total += sum_of_squares(g);
  }
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    autograd::NoGradGuard no_grad;
    CategoryGuard category(MemoryCategory::workspace);
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) ops::mul_(g, scale);
    }
  }
  return norm;
}

}  // namespace memtrain::train
