// AdamW: the hyper-parameter checks and the state; the step is the backend's adamw_step (src/cpu/optim_adamw.cpp:
// bit-identical to torch.optim.AdamW on the CPU; the CUDA kernel agrees with it bit for bit).
#include "memtrain/optim/adamw.h"

#include "core/backend.h"

#include <cmath>

namespace memtrain::optim {

const char* adam_eps_mode_name(AdamEpsMode mode) { return mode == AdamEpsMode::hf ? "hf" : "torch"; }

AdamEpsMode adam_eps_mode_from_name(std::string_view name) {
  if (name == "torch") return AdamEpsMode::torch;
  MT_CHECK(name == "hf", "AdamW", "eps_mode '{}' is not one of torch, hf", name);
  return AdamEpsMode::hf;
}

double adam_kernel_eps(double eps, double beta2, std::int64_t step, AdamEpsMode mode) {
  if (mode == AdamEpsMode::torch) return eps;
  return eps / std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step)));
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamEpsMode eps_mode)
    : Optimizer(std::move(groups)), eps_mode_(eps_mode) {
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
                  group.beta2, adam_kernel_eps(group.eps, group.beta2, state.step, eps_mode_), group.weight_decay,
                  state.step);
}

}  // namespace memtrain::optim
