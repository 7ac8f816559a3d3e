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
// A parameter's norm is train/grad_norm.h's canonical_norm (256-element blocks in double, summed in order), so a
// data-parallel rank that holds only a shard gets it from the ranks' blocks with the same bits.
//
// grad_norm (StepMetrics): the global L2 norm, before clipping, of the gradients the parameters are stepped
// from: .grad for plain parameters, R for projected ones (so with GaLore it reads lower than the ordinary
// step's, since |P^T G| <= |G|); the squares summed in parameter order.
//
// With the canonical tree (TrainerConfig::canonical_reduction), a hook of the last backward first folds its
// parameter's micro-batch sums (GradientTree::complete), then steps it. Data parallel (for_ranks): no hooks;
// the trainer steps each parameter, or its shard, with step_summed once its sum over the ranks has landed
// (GradientSync::set_landed).
#pragma once

#include "memtrain/optim/galore.h"
#include "memtrain/optim/optimizer.h"
#include "train/gradient_tree.h"

#include <memory>
#include <vector>

namespace memtrain::train::detail {

class LayerwiseUpdater {
 public:
  // Registers one hook on every parameter of optimizer's groups. The hooks hold a weak pointer and act only
  // inside a Backward scope, so a backward outside train_step, or after the updater is gone, does nothing.
  static std::shared_ptr<LayerwiseUpdater> install(optim::Optimizer& optimizer, double grad_clip);
  // For a data-parallel rank: no hooks; `whole` are the parameters (in the order GradientSync numbers them),
  // whose sizes set each one's share of grad_clip, while `optimizer` may hold shards of them.
  static std::shared_ptr<LayerwiseUpdater> for_ranks(optim::Optimizer& optimizer, double grad_clip,
                                                     std::vector<Tensor> whole);

  // Marks the backward of one micro-batch while it lives; `last`: the step's last micro-batch (the one that
  // steps). Hooks outside such a scope do nothing.
  class Backward {
   public:
    // `tree`: the step's canonical tree, whose sums a hook completes before stepping (null: none).
    Backward(LayerwiseUpdater& updater, bool last, GradientTree* tree);
    ~Backward();
    Backward(const Backward&) = delete;
    Backward& operator=(const Backward&) = delete;

   private:
    LayerwiseUpdater& updater_;
  };

  void begin_step();  // before the step's first backward: resets the norm
  // Data parallel: steps `target` (whole parameter `index`, or this rank's shard of it, holding its summed
  // gradient) clipped to the parameter's share by `norm`, the whole summed gradient's canonical norm; frees
  // the gradient.
  void step_summed(std::size_t index, Tensor target, double norm);
  // After the last backward: steps what no hook stepped (a parameter whose gradient or accumulator came only
  // from earlier micro-batches) and returns the step's global gradient norm (see the top).
  double finish_step();

 private:
  LayerwiseUpdater(optim::Optimizer& optimizer, double grad_clip, std::vector<Tensor> params);
  void on_ready(std::size_t index);
  void step_now(std::size_t index);  // clip, step, free the gradient; records the norm
  // Scales `grad` in place to parameter index's share of grad_clip when `norm` exceeds it; records the norm.
  void clip(std::size_t index, Tensor grad, double norm);

  optim::Optimizer& optimizer_;
  optim::GaLore* galore_;  // the optimizer as GaLore, or null
  double grad_clip_;
  std::vector<Tensor> params_;
  std::vector<double> clip_to_;  // c_p, by index
  std::vector<double> squares_;  // this step's norm_p^2 by index (NaN: skipped as non-finite)
  bool active_ = false;
  bool last_ = false;
  GradientTree* tree_ = nullptr;
};

}  // namespace memtrain::train::detail
