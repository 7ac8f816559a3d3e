// AdamW (Loshchilov & Hutter), exactly as PyTorch torch.optim.AdamW (amsgrad off):
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// with the hyper-parameters of the parameter's group. State: fp32 "exp_avg" and "exp_avg_sq", 8 bytes per
// element. One fused OpenMP pass over contiguous f32 CPU data.
#pragma once

#include "memtrain/optim/optimizer.h"

namespace memtrain::optim {

class AdamW : public Optimizer {
 public:
  explicit AdamW(std::vector<ParamGroup> groups);
  std::string_view name() const override { return "AdamW"; }

 protected:
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) override;
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;
};

}  // namespace memtrain::optim
