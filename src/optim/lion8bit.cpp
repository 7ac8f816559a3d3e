// Lion8bit: the state (blockwise_optimizer.h); the step is the backend's lion8bit_step (CPU:
// src/cpu/optim_lion8bit.cpp; CUDA: kernels/optim.cu; meta: the bytes only).
#include "memtrain/optim/lion8bit.h"

#include "core/backend.h"
#include "memtrain/optim/factories.h"

namespace memtrain::optim {

Lion8bit::Lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size, std::int64_t min_8bit_size)
    : BlockwiseOptimizer(std::move(groups), block_size, min_8bit_size, "Lion8bit",
                         {{"exp_avg", QuantMap::signed_dynamic}}) {}

void Lion8bit::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const auto [m, m_absmax] = moment(state, "exp_avg", QuantMap::signed_dynamic);
  ::memtrain::detail::backend_for(param.device())
      .lion8bit_step(param, grad, m, m_absmax, block_size(), group.lr, group.beta1, group.beta2,
                     group.weight_decay);
}

std::unique_ptr<Optimizer> make_lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size,
                                         std::int64_t min_8bit_size) {
  return std::make_unique<Lion8bit>(std::move(groups), block_size, min_8bit_size);
}

}  // namespace memtrain::optim
