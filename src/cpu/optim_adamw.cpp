// The AdamW step on the CPU (the contract's adamw_step; the rule of optim::AdamW). The hot path is one pass
// over raw float pointers. The operation order, the f32 rounding of the scalars and the two fused
// multiply-adds follow PyTorch's single-tensor CPU implementation (torch 1.13, AVX2 kernels), so the result
// is bit-identical on the fixture (fma32 is one instruction with -march=native). OpenMP over elements for
// large tensors, SIMD within a thread.
#include "cpu/cpu_backend.h"

#include <cmath>
#include <cstdint>

// Bit-compatibility with PyTorch needs every product rounded on its own except the two explicit fma32
// below; GCC contracts a*b+c into an FMA by default even in ISO mode, so turn that off for this file.
// The loop vectorises only with -fno-math-errno (sqrt's errno branch is control flow; a pragma cannot
// turn math-errno off per function), which the build should pass.
#include "cpu/fp_contract_off.h"  // last: it applies to what follows

namespace memtrain::cpu {
namespace {
// Builtins rather than std::fma/std::sqrt: the std wrappers were compiled without the options above, so
// GCC would refuse to inline them into this loop and it would not vectorise.
#if defined(__GNUC__)
inline float fma32(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float sqrt32(float x) { return __builtin_sqrtf(x); }
#else
inline float fma32(float a, float b, float c) { return std::fma(a, b, c); }
inline float sqrt32(float x) { return std::sqrt(x); }
#endif

// The f32 scalars of one step, rounded from the double hyper-parameters once.
struct AdamWCoeffs {
  float decay;          // 1 - lr * weight_decay
  float b1, one_minus_b1, b2, one_minus_b2;
  float neg_step_size;  // -lr / (1 - beta1^t)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float eps;
};

// p, g, m, v: [n]. m and v are updated in place, then p.
void adamw_step_kernel(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                       std::int64_t n, const AdamWCoeffs& c) {
  const float decay = c.decay, b1 = c.b1, one_minus_b1 = c.one_minus_b1, b2 = c.b2, one_minus_b2 = c.one_minus_b2;
  const float neg_step_size = c.neg_step_size, bc2_sqrt = c.bc2_sqrt, eps = c.eps;
#pragma omp parallel for simd if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    // PyTorch's vectorised add(alpha) and addcmul end in a fused multiply-add: m = fma(g, 1-b1, m*b1),
    // v = fma((1-b2)*g, g, v*b2). Matching them makes this kernel bit-identical to torch.optim.AdamW.
    const float mi = fma32(gi, one_minus_b1, m[i] * b1);
    const float vi = fma32(one_minus_b2 * gi, gi, v[i] * b2);
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrt32(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay + neg_step_size * mi / denom;
  }
}

}  // namespace

void CpuBackend::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                            double lr, double beta1, double beta2, double eps, double weight_decay,
                            std::int64_t step) const {
  const Tensor g32 = grad.to(DType::f32).contiguous();  // on grad's device: meta allocates it too
  const double t = static_cast<double>(step);
  const AdamWCoeffs c{static_cast<float>(1.0 - lr * weight_decay),
                      static_cast<float>(beta1),
                      static_cast<float>(1.0 - beta1),
                      static_cast<float>(beta2),
                      static_cast<float>(1.0 - beta2),
                      static_cast<float>(-lr / (1.0 - std::pow(beta1, t))),
                      static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t))),
                      static_cast<float>(eps)};
  if (runs_kernels())
    adamw_step_kernel(param.data<float>(), g32.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                      param.numel(), c);
}

}  // namespace memtrain::cpu
