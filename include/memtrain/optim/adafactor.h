// Adafactor (Shazeer & Stern 2018), the variant of Hugging Face transformers' `Adafactor` with
// scale_parameter=False, relative_step=False, warmup_init=False (so the step size is the group's lr):
//   beta2_t = 1 - t^decay_rate (decay_rate -0.8);  G = g*g + eps1 (eps1 1e-30)
//   parameters of rank >= 2 (last two dims m x n, leading dims batch): factored second moment
//     R = beta2_t*R + (1-beta2_t)*mean_j G  (m),  C = beta2_t*C + (1-beta2_t)*mean_i G  (n)
//     u = g / sqrt(R C^T / mean(R))          (= r c^T / sum(r) with sums instead of means)
//   rank 0/1: V = beta2_t*V + (1-beta2_t)*G,  u = g / sqrt(V)
//   update clipping: u /= max(1, RMS(u)/clip_threshold) (clip 1.0);  u *= lr
//   optional first moment (off by default): M = beta1*M + (1-beta1)*u, u = M  (beta1 = group.beta1)
//   decoupled weight decay: p -= wd*lr*p;  then p -= u.
// State bytes: (m + n)*4 per m x n matrix (times the batch), 4n per vector, plus 4 per element with the
// first moment. Contiguous f32 parameters on the CPU or a CUDA device (state on the parameter's device; the
// device rule is cuda::adafactor_*_step, equal to this one up to f32 rounding).
#pragma once

#include "memtrain/optim/optimizer.h"

namespace memtrain::optim {

struct AdafactorOptions {
  double decay_rate = -0.8;
  double eps1 = 1e-30;
  double clip_threshold = 1.0;
  bool use_first_moment = false;  // when true, beta1 of each group is the first-moment coefficient
};

class Adafactor : public Optimizer {
 public:
  explicit Adafactor(std::vector<ParamGroup> groups, AdafactorOptions options = {});
  std::string_view name() const override { return "Adafactor"; }
  const AdafactorOptions& options() const { return options_; }

 protected:
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) override;
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;

 private:
  AdafactorOptions options_;
};

}  // namespace memtrain::optim
