// Adafactor: the state and the step count; the step is the backend's adafactor_step (CPU:
// src/cpu/optim_adafactor.cpp, statistics in double; CUDA: kernels/adafactor.cu, deterministic device
// reductions; meta: the bytes only).
#include "memtrain/optim/adafactor.h"

#include "core/backend.h"

namespace memtrain::optim {

Adafactor::Adafactor(std::vector<ParamGroup> groups, AdafactorOptions options)
    : Optimizer(std::move(groups)), options_(options) {
  MT_CHECK(options_.decay_rate < 0.0, "Adafactor", "decay_rate must be negative, got {}", options_.decay_rate);
  MT_CHECK(options_.clip_threshold > 0.0, "Adafactor", "clip_threshold must be positive, got {}",
           options_.clip_threshold);
  MT_CHECK(options_.eps1 >= 0.0, "Adafactor", "eps1 must be >= 0, got {}", options_.eps1);
  if (options_.use_first_moment) {
    for (std::size_t g = 0; g < param_groups().size(); ++g) {
      const double b1 = param_groups()[g].beta1;
      MT_CHECK(b1 >= 0.0 && b1 < 1.0, "Adafactor", "group {}: beta1 must lie in [0, 1), got {}", g, b1);
    }
  }
}

void Adafactor::init_state(const Tensor& param, const ParamGroup&, ParamState& state) {
  check_f32_contiguous(param, "Adafactor");
  const Shape& s = param.shape();
  const Device device = param.device();
  if (s.size() >= 2) {
    Shape row(s.begin(), s.end() - 1);  // [..., m]
    Shape col(s.begin(), s.end() - 2);  // [..., n]
    col.push_back(s.back());
    state.tensors["exp_avg_sq_row"] = zeros(row, DType::f32, device);
    state.tensors["exp_avg_sq_col"] = zeros(col, DType::f32, device);
  } else {
    state.tensors["exp_avg_sq"] = zeros(s, DType::f32, device);
  }
  if (options_.use_first_moment) state.tensors["exp_avg"] = zeros(s, DType::f32, device);
}

void Adafactor::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const auto get = [&state](const char* name) {
    const auto it = state.tensors.find(name);
    return it == state.tensors.end() ? Tensor() : it->second;
  };
  ::memtrain::detail::backend_for(param.device())
      .adafactor_step(param, grad, get("exp_avg_sq_row"), get("exp_avg_sq_col"), get("exp_avg_sq"), get("exp_avg"),
                      group.lr, group.weight_decay, group.beta1, options_.decay_rate, options_.eps1,
                      options_.clip_threshold, state.step);
}

}  // namespace memtrain::optim
