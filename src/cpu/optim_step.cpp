// Optimizer steps and gradient utilities on the CPU (the contract's sgd_step, lion_step, all_finite,
// sum_of_squares; adamw_step is in optim_adamw.cpp, whose rounding needs fp-contract off). Each kernel is
// one fused pass over raw float pointers, OpenMP over elements for large tensors, SIMD within a thread.
// Every entry converts a gradient it cannot read in place to f32 on the gradient's own device, so meta
// allocates that copy as the CPU does, and runs its kernel only under runs_kernels().
#include "cpu/convert.h"
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace memtrain::cpu {
namespace {

// p, g: [n]. SGD without momentum; weight decay is added to the gradient (d = g + wd p), as optim::SGD.
void sgd_step_plain(float* p, const float* g, std::int64_t n, float lr, float wd) {
#pragma omp parallel for simd if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
}

// p, g, buf: [n]. buf = d on the first step (its old contents are not read), else m buf + d.
void sgd_step_momentum(float* p, const float* g, float* buf, std::int64_t n, float lr, float wd, float m, bool first,
                       bool nesterov) {
#pragma omp parallel for simd if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) {
    const float d = g[i] + wd * p[i];
    const float b = first ? d : m * buf[i] + d;
    buf[i] = b;
    p[i] -= lr * (nesterov ? d + m * b : b);
  }
}

// p, g, m: [n]. p = p (1 - lr wd) - lr sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g.
void lion_step_kernel(float* __restrict p, const float* __restrict g, float* __restrict m, std::int64_t n,
                      float decay, float lr, float b1, float one_minus_b1, float b2, float one_minus_b2) {
#pragma omp parallel for simd if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) {
    const float c = b1 * m[i] + one_minus_b1 * g[i];
    const float s = static_cast<float>((c > 0.0f) - (c < 0.0f));
    p[i] = p[i] * decay - lr * s;
    m[i] = b2 * m[i] + one_minus_b2 * g[i];
  }
}

bool all_finite_kernel(const float* x, std::int64_t n) {
  int bad = 0;
#pragma omp parallel for reduction(| : bad) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) bad |= !std::isfinite(x[i]);
  return bad == 0;
}

// In double: over ~1e8 fp32 terms a float accumulator would lose the small gradients entirely.
template <typename T>
double sum_of_squares_kernel(const T* p, std::int64_t n) {
  double acc = 0.0;
#pragma omp parallel for reduction(+ : acc) schedule(static) if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  return acc;
}

}  // namespace

void CpuBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
                          double momentum, double weight_decay, bool nesterov, std::int64_t step) const {
  const Tensor g32 = grad.to(DType::f32).contiguous();
  if (!runs_kernels()) return;
  const float flr = static_cast<float>(lr), wd = static_cast<float>(weight_decay);
  if (momentum == 0.0) {
    sgd_step_plain(param.data<float>(), g32.data<float>(), param.numel(), flr, wd);
    return;
  }
  sgd_step_momentum(param.data<float>(), g32.data<float>(), momentum_buffer.data<float>(), param.numel(), flr, wd,
                    static_cast<float>(momentum), step == 1, nesterov);
}

void CpuBackend::lion_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, double lr, double beta1,
                           double beta2, double weight_decay) const {
  const Tensor g32 = grad.to(DType::f32).contiguous();
  if (!runs_kernels()) return;
  lion_step_kernel(param.data<float>(), g32.data<float>(), exp_avg.data<float>(), param.numel(),
                   static_cast<float>(1.0 - lr * weight_decay), static_cast<float>(lr), static_cast<float>(beta1),
                   static_cast<float>(1.0 - beta1), static_cast<float>(beta2), static_cast<float>(1.0 - beta2));
}

namespace {

// bf16 / f16 bits: Inf or NaN exactly when the exponent field is all ones.
bool all_finite_16(const std::uint16_t* x, std::int64_t n, std::uint16_t exponent) {
  int bad = 0;
#pragma omp parallel for reduction(| : bad) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) bad |= (x[i] & exponent) == exponent;
  return bad == 0;
}

}  // namespace

bool CpuBackend::all_finite(const Tensor& g) const {
  // A contiguous bf16 / f16 gradient (a bf16 parameter's) is read as it is: no f32 copy of it.
  if (g.is_contiguous() && (g.dtype() == DType::bf16 || g.dtype() == DType::f16)) {
    if (!runs_kernels()) return true;
    return all_finite_16(static_cast<const std::uint16_t*>(g.data_ptr()), g.numel(),
                         g.dtype() == DType::bf16 ? std::uint16_t{0x7f80} : std::uint16_t{0x7c00});
  }
  const Tensor f = g.to(DType::f32).contiguous();
  return runs_kernels() ? all_finite_kernel(f.data<float>(), f.numel()) : true;
}

void CpuBackend::block_sums_of_squares(const Tensor& x, double* out) const {
  if (!runs_kernels()) return;
  constexpr std::int64_t kBlock = 256;
  const float* g = x.data<float>();
  const std::int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 64 * kBlock)
  for (std::int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
    double sum = 0.0;
    for (std::int64_t j = b * kBlock; j < std::min(n, (b + 1) * kBlock); ++j) sum += static_cast<double>(g[j]) * g[j];
    out[b] = sum;
  }
}

double CpuBackend::sum_of_squares(const std::vector<Tensor>& tensors) const {
  // f32 and f64 contiguous are read in place; another dtype (a bf16 parameter's gradient) is widened 1 Mi
  // elements at a time into one buffer, so the norm never holds an f32 copy of a whole gradient.
  constexpr std::int64_t kWidenChunk = std::int64_t{1} << 20;
  double total = 0.0;
  for (const Tensor& t : tensors) {
    const Tensor c = t.contiguous();
    if (c.dtype() == DType::f64 || c.dtype() == DType::f32) {
      if (runs_kernels()) {
        total += c.dtype() == DType::f64 ? sum_of_squares_kernel(c.data<double>(), c.numel())
                                         : sum_of_squares_kernel(c.data<float>(), c.numel());
      }
      continue;
    }
    const Tensor buffer = Tensor::empty({std::min(c.numel(), kWidenChunk)}, DType::f32, c.device());
    if (!runs_kernels()) continue;
    const auto* bytes = static_cast<const char*>(c.data_ptr());
    for (std::int64_t a = 0; a < c.numel(); a += kWidenChunk) {
      const std::int64_t len = std::min(kWidenChunk, c.numel() - a);
      convert(bytes + a * static_cast<std::int64_t>(c.element_size()), c.dtype(), buffer.data<float>(), DType::f32,
              static_cast<std::size_t>(len));
      total += sum_of_squares_kernel(buffer.data<float>(), len);
    }
  }
  return total;
}

}  // namespace memtrain::cpu
