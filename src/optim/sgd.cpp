// SGD: the hyper-parameter checks and the momentum buffer; the step is the backend's sgd_step
// (src/cpu/optim_step.cpp).
#include "memtrain/optim/sgd.h"

#include "core/backend.h"

namespace memtrain::optim {

SGD::SGD(std::vector<ParamGroup> groups, bool nesterov) : Optimizer(std::move(groups)), nesterov_(nesterov) {
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    const ParamGroup& group = param_groups()[g];
    MT_CHECK(group.beta1 >= 0.0, "SGD", "group {}: momentum (beta1) must be >= 0, got {}", g, group.beta1);
    MT_CHECK(!nesterov || group.beta1 > 0.0, "SGD", "group {}: Nesterov needs momentum > 0", g);
  }
}

void SGD::init_state(const Tensor& param, const ParamGroup& group, ParamState& state) {
  check_f32_contiguous(param, "SGD");
  if (group.beta1 > 0.0) state.tensors["momentum_buffer"] = Tensor::empty(param.shape(), DType::f32, param.device());
}

void SGD::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const Tensor momentum_buffer = group.beta1 > 0.0 ? state.tensors.at("momentum_buffer") : Tensor();
  ::memtrain::detail::backend_for(param.device())
      .sgd_step(param, grad, momentum_buffer, group.lr, group.beta1, group.weight_decay, nesterov_, state.step);
}

}  // namespace memtrain::optim
