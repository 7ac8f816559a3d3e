// AdamW (Loshchilov & Hutter), exactly as PyTorch torch.optim.AdamW (amsgrad off):
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// with the hyper-parameters of the parameter's group. State: fp32 "exp_avg" and "exp_avg_sq", 8 bytes per
// element. One fused OpenMP pass over contiguous f32 CPU data.
//
// Epsilon form (AdamEpsMode): `torch` (the default) is the form above. `hf` is Hugging Face's AdamW (and
// galore_torch's): p -= lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps), which is the form above with eps
// replaced by eps/sqrt(1-b2^t) (about 31x smaller at step 1 with b2 = 0.999): that is how it runs, so both
// forms share the kernels and differ from each other's formula only by float rounding.
#pragma once

#include "memtrain/optim/optimizer.h"

#include <string>
#include <string_view>

namespace memtrain::optim {

enum class AdamEpsMode { torch, hf };
const char* adam_eps_mode_name(AdamEpsMode mode);  // "torch", "hf"
AdamEpsMode adam_eps_mode_from_name(std::string_view name);  // throws naming both
// The eps the torch-form kernels take at step t (>= 1) for `mode`.
double adam_kernel_eps(double eps, double beta2, std::int64_t step, AdamEpsMode mode);

class AdamW : public Optimizer {
 public:
  explicit AdamW(std::vector<ParamGroup> groups, AdamEpsMode eps_mode = AdamEpsMode::torch);
  std::string_view name() const override { return "AdamW"; }
  std::int64_t elementwise_block() const override { return 1; }  // per-element state
  AdamEpsMode eps_mode() const { return eps_mode_; }

 protected:
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) override;
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;

 private:
  AdamEpsMode eps_mode_;
};

}  // namespace memtrain::optim
