// Lion: the hyper-parameter checks and the state; the step is the backend's lion_step (src/cpu/optim_step.cpp).
#include "memtrain/optim/lion.h"

#include "core/backend.h"

namespace memtrain::optim {

Lion::Lion(std::vector<ParamGroup> groups) : Optimizer(std::move(groups)) {
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    const ParamGroup& group = param_groups()[g];
    MT_CHECK(group.beta1 >= 0.0 && group.beta1 <= 1.0 && group.beta2 >= 0.0 && group.beta2 <= 1.0, "Lion",
             "group {}: betas must lie in [0, 1], got ({}, {})", g, group.beta1, group.beta2);
  }
}

void Lion::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "Lion");
  state.tensors["exp_avg"] = zeros(param.shape(), DType::f32, param.device());
}

void Lion::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  ::memtrain::detail::backend_for(param.device())
      .lion_step(param, grad, state.tensors.at("exp_avg"), group.lr, group.beta1, group.beta2, group.weight_decay);
}

}  // namespace memtrain::optim
