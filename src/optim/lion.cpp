// Lion: one fused pass per parameter on raw float pointers.
#include "memtrain/optim/lion.h"

#include "memtrain/cuda/optim.h"

namespace memtrain::optim {

Lion::Lion(std::vector<ParamGroup> groups) : Optimizer(std::move(groups)) {
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    const ParamGroup& group = param_groups()[g];
    MT_CHECK(group.beta1 >= 0.0 && group.beta1 <= 1.0 && group.beta2 >= 0.0 && group.beta2 <= 1.0, "Lion",
             "group {}: betas must lie in [0, 1], got ({}, {})", g, group.beta1, group.beta2);
  }
}

void Lion::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "Lion", /*cuda_ok=*/true);
  state.tensors["exp_avg"] = zeros(param.shape(), DType::f32, param.device());
}

void Lion::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor g32 = grad_f32(grad, param.device());
  if (param.device().is_cuda()) {
    const cuda::LionHyper hyper{group.lr, group.weight_decay, group.beta1, group.beta2, /*skip_nonfinite=*/false};
    cuda::lion_step(param.data<float>(), g32.data<float>(), state.tensors.at("exp_avg").data<float>(),
                    static_cast<std::size_t>(param.numel()), hyper, param.device().index);
    return;
  }
  const float* __restrict g = g32.data<float>();
  float* __restrict p = param.data<float>();
  float* __restrict m = state.tensors.at("exp_avg").data<float>();
  const std::int64_t n = param.numel();
  const float decay = static_cast<float>(1.0 - group.lr * group.weight_decay);
  const float lr = static_cast<float>(group.lr);
  const float b1 = static_cast<float>(group.beta1), one_minus_b1 = static_cast<float>(1.0 - group.beta1);
  const float b2 = static_cast<float>(group.beta2), one_minus_b2 = static_cast<float>(1.0 - group.beta2);
#pragma omp parallel for simd if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) {
    const float c = b1 * m[i] + one_minus_b1 * g[i];
    const float s = static_cast<float>((c > 0.0f) - (c < 0.0f));
    p[i] = p[i] * decay - lr * s;
    m[i] = b2 * m[i] + one_minus_b2 * g[i];
  }
}

}  // namespace memtrain::optim
