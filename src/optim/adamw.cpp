// AdamW: the hot path is one pass over raw float pointers. The operation order, the f32 rounding of the
// scalars and the two fused multiply-adds follow PyTorch's single-tensor CPU implementation (torch 1.13,
// AVX2 kernels), so the result is bit-identical on the fixture (fma32 is one instruction with -march=native).
#include "memtrain/optim/adamw.h"

#include "memtrain/cuda/optim.h"

#include <cmath>

// Bit-compatibility with PyTorch needs every product rounded on its own except the two explicit fma32
// below; GCC contracts a*b+c into an FMA by default even in ISO mode, so turn that off for this file.
// The loop vectorises only with -fno-math-errno (sqrt's errno branch is control flow; a pragma cannot
// turn math-errno off per function), which the build should pass.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace memtrain::optim {
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
}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups) : Optimizer(std::move(groups)) {
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    const ParamGroup& group = param_groups()[g];
    MT_CHECK(group.beta1 >= 0.0 && group.beta1 < 1.0 && group.beta2 >= 0.0 && group.beta2 < 1.0, "AdamW",
             "group {}: betas must lie in [0, 1), got ({}, {})", g, group.beta1, group.beta2);
    MT_CHECK(group.eps >= 0.0, "AdamW", "group {}: eps must be >= 0, got {}", g, group.eps);
  }
}

void AdamW::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "AdamW", /*cuda_ok=*/true);
  state.tensors["exp_avg"] = zeros(param.shape(), DType::f32, param.device());
  state.tensors["exp_avg_sq"] = zeros(param.shape(), DType::f32, param.device());
}

void AdamW::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor g32 = grad_f32(grad, param.device());
  if (param.device().is_cuda()) {
    // The base already checked the gradient is finite, so the kernel need not look again.
    const cuda::AdamWHyper hyper{group.lr, group.weight_decay, group.beta1, group.beta2, group.eps, state.step,
                                 /*skip_nonfinite=*/false};
    cuda::adamw_step(param.data<float>(), g32.data<float>(), state.tensors.at("exp_avg").data<float>(),
                     state.tensors.at("exp_avg_sq").data<float>(), static_cast<std::size_t>(param.numel()), hyper,
                     param.device().index);
    return;
  }
  const float* __restrict g = g32.data<float>();
  float* __restrict p = param.data<float>();
  float* __restrict m = state.tensors.at("exp_avg").data<float>();
  float* __restrict v = state.tensors.at("exp_avg_sq").data<float>();
  const std::int64_t n = param.numel();

  const double t = static_cast<double>(state.step);
  const float decay = static_cast<float>(1.0 - group.lr * group.weight_decay);
  const float b1 = static_cast<float>(group.beta1), one_minus_b1 = static_cast<float>(1.0 - group.beta1);
  const float b2 = static_cast<float>(group.beta2), one_minus_b2 = static_cast<float>(1.0 - group.beta2);
  const float neg_step_size = static_cast<float>(-group.lr / (1.0 - std::pow(group.beta1, t)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(group.beta2, t)));
  const float eps = static_cast<float>(group.eps);

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

}  // namespace memtrain::optim
