// Layer-wise updates (TrainerConfig.layerwise_update): every parameter is stepped inside its gradient-ready
// hook during the backward of the step's last micro-batch, and its gradient freed at once, so at most about
// one layer's gradients are alive instead of the model's.
//
// Earlier micro-batches: a GaLore-projected weight adds P^T G into its accumulator (optim::GaLore::accumulate,
// r x n floats instead of m x n) and frees G; any other parameter lets .grad accumulate as usual, so it
// saves nothing under accumulation.
//
// Clipping (grad_clip > 0): the global norm is known only after the last gradient, when the others have been
// applied, so each parameter is clipped on its own to its share of the threshold,
//   c_p = grad_clip * sqrt(n_p / N)     (n_p its elements, N those of all parameters),
// scaling the gradient its step uses by c_p / (norm_p + 1e-6) when norm_p > c_p: for a projected weight its
// projected gradient R (the full accumulated gradient never exists; scaling commutes with projection), for the
// others .grad. Since sum_p c_p^2 = grad_clip^2, the global norm of the applied gradients never exceeds
// grad_clip; it equals global clipping when every norm_p is proportional to sqrt(n_p). Unlike global
// clipping it may clip a parameter whose gradient is outsized for its share even when the global norm is
// below grad_clip (that is what not waiting for the global norm costs).
//
// grad_norm (StepMetrics): the global L2 norm, before clipping, of the gradients the parameters are stepped
// from, summed from the hooks: .grad for plain parameters, R for projected ones (so with GaLore it reads
// lower than the ordinary step's, since |P^T G| <= |G|).
#pragma once

#include "memtrain/optim/galore.h"
#include "memtrain/optim/optimizer.h"

#include <memory>
#include <unordered_map>
#include <vector>

namespace memtrain::train::detail {

class LayerwiseUpdater {
 public:
  // Registers one hook on every parameter of optimizer's groups. The hooks hold a weak pointer and act only
  // inside a Backward scope, so a backward outside train_step, or after the updater is gone, does nothing.
  static std::shared_ptr<LayerwiseUpdater> install(optim::Optimizer& optimizer, double grad_clip);

  // Marks the backward of one micro-batch while it lives; `last`: the step's last micro-batch (the one that
  // steps). Hooks outside such a scope do nothing.
  class Backward {
   public:
    Backward(LayerwiseUpdater& updater, bool last);
    ~Backward();
    Backward(const Backward&) = delete;
    Backward& operator=(const Backward&) = delete;

   private:
    LayerwiseUpdater& updater_;
  };

  void begin_step();  // before the step's first backward: resets the norm
  // After the last backward: steps what no hook stepped (a parameter whose gradient or accumulator came only
  // from earlier micro-batches) and returns the step's global gradient norm (see the top).
  double finish_step();

 private:
  LayerwiseUpdater(optim::Optimizer& optimizer, double grad_clip);
  void on_ready(const Tensor& param);
  void step_now(const Tensor& param);  // clip, step, free the gradient; adds to the norm

  optim::Optimizer& optimizer_;
  optim::GaLore* galore_;  // the optimizer as GaLore, or null
  double grad_clip_;
  std::vector<Tensor> params_;
  std::unordered_map<const TensorImpl*, double> clip_to_;  // c_p
  bool active_ = false;
  bool last_ = false;
  double sum_squares_ = 0.0;
};

}  // namespace memtrain::train::detail
