// SGD with PyTorch torch.optim.SGD semantics (dampening 0): d = g + wd*p (L2, added to the gradient);
// with momentum m = group.beta1 > 0: buf = d on the first step, then buf = m*buf + d; the step direction
// is buf, or d + m*buf with Nesterov. p -= lr*direction. State: "momentum_buffer" (4 bytes per element)
// only for groups with momentum; none otherwise. CPU, contiguous f32 parameters.
#pragma once

#include "memtrain/optim/optimizer.h"

namespace memtrain::optim {

class SGD : public Optimizer {
 public:
  // Momentum is each group's beta1 (0 = plain SGD); weight_decay is L2 on the gradient.
  explicit SGD(std::vector<ParamGroup> groups, bool nesterov = false);
  std::string_view name() const override { return "SGD"; }
  std::int64_t elementwise_block() const override { return 1; }  // per-element state

 protected:
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) override;
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;

 private:
  bool nesterov_;
};

}  // namespace memtrain::optim
