// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), fp32 state:
//   c = b1*m + (1-b1)*g;  p = p*(1 - lr*wd) - lr*sign(c);  m = b2*m + (1-b2)*g
// with b1 = group.beta1, b2 = group.beta2 (the paper's defaults are .9/.99; spec.h uses them) and sign(0) = 0.
// State: "exp_avg", 4 bytes per element. CPU, contiguous f32 parameters.
#pragma once

#include "memtrain/optim/optimizer.h"

namespace memtrain::optim {

class Lion : public Optimizer {
 public:
  explicit Lion(std::vector<ParamGroup> groups);
  std::string_view name() const override { return "Lion"; }
  std::int64_t elementwise_block() const override { return 1; }  // per-element state

 protected:
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) override;
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;
};

}  // namespace memtrain::optim
