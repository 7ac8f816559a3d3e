// SGD: one fused pass per parameter on raw float pointers.
#include "memtrain/optim/sgd.h"

#include "memtrain/cuda/optim.h"

namespace memtrain::optim {

SGD::SGD(std::vector<ParamGroup> groups, bool nesterov) : Optimizer(std::move(groups)), nesterov_(nesterov) {
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    const ParamGroup& group = param_groups()[g];
    MT_CHECK(group.beta1 >= 0.0, "SGD", "group {}: momentum (beta1) must be >= 0, got {}", g, group.beta1);
    MT_CHECK(!nesterov || group.beta1 > 0.0, "SGD", "group {}: Nesterov needs momentum > 0", g);
  }
}

void SGD::init_state(const Tensor& param, const ParamGroup& group, ParamState& state) {
  check_f32_contiguous(param, "SGD", /*cuda_ok=*/true);
  if (group.beta1 > 0.0) state.tensors["momentum_buffer"] = Tensor::empty(param.shape(), DType::f32, param.device());
}

void SGD::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor g32 = grad_f32(grad, param.device());
  if (param.device().is_cuda()) {
    const cuda::SgdHyper hyper{group.lr, group.weight_decay, group.beta1, nesterov_, state.step,
                               /*skip_nonfinite=*/false};
    float* momentum = group.beta1 > 0.0 ? state.tensors.at("momentum_buffer").data<float>() : nullptr;
    cuda::sgd_step(param.data<float>(), g32.data<float>(), momentum, static_cast<std::size_t>(param.numel()), hyper,
                   param.device().index);
    return;
  }
  const float* g = g32.data<float>();
  float* p = param.data<float>();
  const std::int64_t n = param.numel();
  const float lr = static_cast<float>(group.lr);
  const float wd = static_cast<float>(group.weight_decay);
  if (group.beta1 == 0.0) {
#pragma omp parallel for simd if (n > 32768)
    for (std::int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  float* buf = state.tensors.at("momentum_buffer").data<float>();
  const float m = static_cast<float>(group.beta1);
  const bool first = state.step == 1;
  const bool nesterov = nesterov_;
#pragma omp parallel for simd if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) {
    const float d = g[i] + wd * p[i];
    const float b = first ? d : m * buf[i] + d;
    buf[i] = b;
    p[i] -= lr * (nesterov ? d + m * b : b);
  }
}

}  // namespace memtrain::optim
