// AdamW: the hyper-parameter checks and the state; the step is the backend's adamw_step (src/cpu/optim_adamw.cpp:
// bit-identical to torch.optim.AdamW on the CPU; the CUDA kernel agrees with it bit for bit).
#include "memtrain/optim/adamw.h"

#include "core/backend.h"

namespace memtrain::optim {

AdamW::AdamW(std::vector<ParamGroup> groups) : Optimizer(std::move(groups)) {
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    const ParamGroup& group = param_groups()[g];
    MT_CHECK(group.beta1 >= 0.0 && group.beta1 < 1.0 && group.beta2 >= 0.0 && group.beta2 < 1.0, "AdamW",
             "group {}: betas must lie in [0, 1), got ({}, {})", g, group.beta1, group.beta2);
    MT_CHECK(group.eps >= 0.0, "AdamW", "group {}: eps must be >= 0, got {}", g, group.eps);
  }
}

void AdamW::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "AdamW");
  state.tensors["exp_avg"] = zeros(param.shape(), DType::f32, param.device());
  state.tensors["exp_avg_sq"] = zeros(param.shape(), DType::f32, param.device());
}

void AdamW::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  ::memtrain::detail::backend_for(param.device())
      .adamw_step(param, grad, state.tensors.at("exp_avg"), state.tensors.at("exp_avg_sq"), group.lr, group.beta1,
                  group.beta2, group.eps, group.weight_decay, state.step);
}

}  // namespace memtrain::optim
