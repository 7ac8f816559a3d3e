// Gradient clipping by global L2 norm. The sum of squares runs in double: over ~1e8 fp32 terms a float
// accumulator would lose the small gradients entirely.
// CUDA gradients stay on their device: cuda::sum_of_squares gives one f64 per gradient, the values come back
// in one copy per device and are added in double. The clip itself is ops::mul_ on the device.
#include "train/grad_norm.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/cuda/reduce.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <map>

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

// Sum over `grads` (all on CUDA device `device`) of their sums of squares: one f64 per gradient from
// cuda::sum_of_squares (squared and added in f64, as the CPU does), read back in one copy.
double device_sum_of_squares(const std::vector<Tensor>& grads, Device device) {
  CategoryGuard category(MemoryCategory::workspace);
  const Tensor sums = Tensor::empty({static_cast<std::int64_t>(grads.size())}, DType::f64, device);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Tensor g = grads[i].detach().contiguous();
    cuda::sum_of_squares(g.data_ptr(), g.dtype(), static_cast<std::size_t>(g.numel()), sums.data<double>() + i,
                         device.index);
  }
  const Tensor host = sums.to(Device::cpu());
  double total = 0.0;
  for (std::size_t i = 0; i < grads.size(); ++i) total += host.data<double>()[i];
  return total;
}

}  // namespace

namespace detail {

double sum_of_squares(const std::vector<Tensor>& tensors) {
  autograd::NoGradGuard no_grad;
  double total = 0.0;
  std::map<int, std::vector<Tensor>> on_cuda;  // by device index, in order
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (t.device().is_cuda() && t.numel() > 0) on_cuda[t.device().index].push_back(t);
    else if (t.device().is_cpu()) total += ::memtrain::train::sum_of_squares(t);
  }
  for (const auto& [index, grads] : on_cuda) total += device_sum_of_squares(grads, Device::cuda(index));
  return total;
}

}  // namespace detail

double global_grad_norm(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const Tensor& p : params) grads.push_back(p.grad());
  return std::sqrt(detail::sum_of_squares(grads));
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
