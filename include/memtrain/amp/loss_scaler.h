// Dynamic loss scaling for fp16 training, the rule of torch.cuda.amp.GradScaler and apex's dynamic scaler.
// fp16 flushes gradients below 2^-24 to zero, so backward is seeded with scale * dloss and runs on gradients
// `scale` times too large; before anything reads them, unscale_ divides them back and reports whether they
// are all finite. A step whose gradients hold Inf/NaN is skipped and the scale backs off; after
// growth_interval finite steps in a row the scale grows again, so it hovers just under the overflow point.
//
// One training step with it:
//   backward seeded with scaler.scale() * dloss
//   const bool finite = scaler.unscale_(grads);   // grads now in true units
//   if (finite) { clip_grad_norm(params, max_norm); optimizer.step(); }
//   scaler.update(!finite);
// Unscale before clipping: the clip threshold is a norm in true-gradient units; clipping scaled gradients
// would compare scale * |g| with it and shrink almost every step to max_norm / scale.
//
// Finiteness is judged on the unscaled values, the ones the optimizer will read. For scale >= 1 that is the
// same verdict as on the scaled ones (dividing only shrinks a finite value; Inf and NaN stay non-finite),
// but with min_scale < 1 dividing can push a finite f16/bf16 value past the largest finite one.
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/optim/optimizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::amp {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16, as torch.cuda.amp.GradScaler
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;  // consecutive finite steps before the scale grows
  // Backoff stops here. An overflow found while the scale already sits at min_scale throws (as DeepSpeed's
  // scaler): at scale 1 the gradients are non-finite in true units (a diverged loss, a NaN in the forward),
  // which no loss scale can fix, and clamping would instead skip every step from then on without a word.
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24: growth stops here
};

class DynamicLossScaler {
 public:
  // Throws naming the field unless: init_scale > 0 and finite, growth_factor > 1 and finite,
  // 0 < backoff_factor < 1, growth_interval >= 1, 0 < min_scale <= init_scale <= max_scale < inf.
  explicit DynamicLossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  const LossScalerOptions& options() const { return options_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }
  std::int64_t growth_tracker() const { return growth_tracker_; }  // finite steps since the scale last changed

  // Divides every defined gradient in place by scale() and returns true when every unscaled element is
  // finite. Each value is divided in f64 and rounded once to the gradient's dtype (f64, f32, f16 or bf16),
  // which gives the correctly rounded quotient; with a power-of-two scale (the default factors keep it one)
  // it is exact unless the result falls below the dtype's normal range. Undefined tensors are skipped;
  // gradients that are not contiguous CPU tensors go through a contiguous CPU copy that is written back.
  // All gradients are unscaled even after a non-finite one. Throws, changing nothing, on another dtype.
  // Each gradient must appear once (a tensor listed twice would be divided twice).
  bool unscale_(const std::vector<Tensor>& grads);

  // After a step attempt. found_inf: the scale is multiplied by backoff_factor (not below min_scale), the
  // growth tracker resets and the step counts as skipped; throws, changing nothing, when the scale already
  // is min_scale. Otherwise the tracker counts up, and on reaching growth_interval the scale is multiplied
  // by growth_factor (not above max_scale) and the tracker resets.
  void update(bool found_inf);

  // Writes "<prefix>.scale" (f64 scalar), "<prefix>.growth_tracker" and "<prefix>.skipped_steps" (i64
  // scalars) into `out`, for checkpoint files.
  void save(optim::StateDict& out, const std::string& prefix) const;
  // Reads back what save wrote; throws naming the key, changing nothing, when a key is missing, is not a
  // 0-d tensor of the right dtype, or is out of range for these options (scale outside
  // [min_scale, max_scale], growth_tracker outside [0, growth_interval), skipped_steps < 0). Other keys
  // in `in` are ignored: the dict is shared with the model and optimizer state.
  void load(const optim::StateDict& in, const std::string& prefix);

 private:
  LossScalerOptions options_;
  double scale_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t skipped_steps_ = 0;
};

}  // namespace memtrain::amp
