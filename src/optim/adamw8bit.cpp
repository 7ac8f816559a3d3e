// AdamW8bit: the state (blockwise_optimizer.h) and the step count; the step is the backend's adamw8bit_step
// (CPU: src/cpu/optim_adamw8bit.cpp, OpenMP over blocks, each decoded, updated and requantized in L1;
// CUDA: kernels/optim.cu, one block in registers; meta: the bytes only).
#include "memtrain/optim/adamw8bit.h"

#include "core/backend.h"
#include "memtrain/optim/factories.h"

namespace memtrain::optim {

AdamW8bit::AdamW8bit(std::vector<ParamGroup> groups, std::int64_t block_size, std::int64_t min_8bit_size,
                     AdamEpsMode eps_mode)
    : BlockwiseOptimizer(std::move(groups), block_size, min_8bit_size, "AdamW8bit",
                         {{"exp_avg", QuantMap::signed_dynamic}, {"exp_avg_sq", QuantMap::unsigned_dynamic}}),
      eps_mode_(eps_mode) {}

void AdamW8bit::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const auto [m, m_absmax] = moment(state, "exp_avg", QuantMap::signed_dynamic);
  const auto [v, v_absmax] = moment(state, "exp_avg_sq", QuantMap::unsigned_dynamic);
  ::memtrain::detail::backend_for(param.device())
      .adamw8bit_step(param, grad, m, m_absmax, v, v_absmax, block_size(), group.lr, group.beta1, group.beta2,
                      adam_kernel_eps(group.eps, group.beta2, state.step, eps_mode_), group.weight_decay, state.step);
}

std::unique_ptr<Optimizer> make_adamw8bit(std::vector<ParamGroup> groups, std::int64_t block_size,
                                          std::int64_t min_8bit_size, AdamEpsMode eps_mode) {
  return std::make_unique<AdamW8bit>(std::move(groups), block_size, min_8bit_size, eps_mode);
}

}  // namespace memtrain::optim
