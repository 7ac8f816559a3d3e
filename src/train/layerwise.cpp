// Layer-wise updates: the gradient-ready hooks that step each parameter during backward (see layerwise.h).
#include "train/layerwise.h"
#include "train/grad_norm.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/train/trainer.h"

#include <cmath>
#include <limits>

namespace memtrain::train::detail {

LayerwiseUpdater::LayerwiseUpdater(optim::Optimizer& optimizer, double grad_clip, std::vector<Tensor> params)
    : optimizer_(optimizer), galore_(dynamic_cast<optim::GaLore*>(&optimizer)), grad_clip_(grad_clip),
      params_(std::move(params)), squares_(params_.size(), 0.0) {
  double total = 0.0;
  for (const Tensor& p : params_) total += static_cast<double>(p.numel());
  for (const Tensor& p : params_) clip_to_.push_back(grad_clip_ * std::sqrt(static_cast<double>(p.numel()) / total));
}

std::shared_ptr<LayerwiseUpdater> LayerwiseUpdater::install(optim::Optimizer& optimizer, double grad_clip) {
  std::vector<Tensor> params;
  for (const auto& g : optimizer.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
  std::shared_ptr<LayerwiseUpdater> updater(new LayerwiseUpdater(optimizer, grad_clip, std::move(params)));
  const std::weak_ptr<LayerwiseUpdater> weak = updater;
  for (std::size_t k = 0; k < updater->params_.size(); ++k) {
    updater->params_[k].register_grad_ready_hook([weak, k](Tensor&) {
      if (auto u = weak.lock()) u->on_ready(k);
    });
  }
  return updater;
}

std::shared_ptr<LayerwiseUpdater> LayerwiseUpdater::for_ranks(optim::Optimizer& optimizer, double grad_clip,
                                                              std::vector<Tensor> whole) {
  return std::shared_ptr<LayerwiseUpdater>(new LayerwiseUpdater(optimizer, grad_clip, std::move(whole)));
}

LayerwiseUpdater::Backward::Backward(LayerwiseUpdater& updater, bool last, GradientTree* tree) : updater_(updater) {
  updater_.active_ = true;
  updater_.last_ = last;
  updater_.tree_ = tree;
}

LayerwiseUpdater::Backward::~Backward() {
  updater_.active_ = false;
  updater_.tree_ = nullptr;
}

void LayerwiseUpdater::begin_step() { squares_.assign(params_.size(), 0.0); }

void LayerwiseUpdater::on_ready(std::size_t index) {
  if (!active_) return;
  const Tensor& param = params_[index];
  if (last_) {
    if (tree_ != nullptr) tree_->complete(index);
    step_now(index);
  } else if (galore_ && galore_->is_projected(param)) {
    galore_->accumulate(param, param.grad());
    Tensor(param).set_grad(Tensor());
  }
  // Any other parameter keeps accumulating into .grad (or the tree's leaves) until the last micro-batch.
}

void LayerwiseUpdater::clip(std::size_t index, Tensor grad, double norm) {
  squares_[index] = norm * norm;
  if (grad_clip_ > 0.0 && std::isfinite(norm) && norm > clip_to_[index]) {
    autograd::NoGradGuard no_grad;
    CategoryGuard category(MemoryCategory::workspace);
    ops::mul_(grad, clip_to_[index] / (norm + 1e-6));  // the factor clip_grad_norm applies
  }
}

void LayerwiseUpdater::step_now(std::size_t index) {
  Tensor p = params_[index];
  if (galore_ && galore_->is_projected(p)) {
    Tensor R = galore_->projected_gradient(p, p.grad());
    p.set_grad(Tensor());  // G is spent: free it before the step's temporaries
    if (!R.defined()) {    // a non-finite gradient: skipped, as the ordinary step skips it
      squares_[index] = std::numeric_limits<double>::quiet_NaN();
      return;
    }
    clip(index, R, canonical_norm(R));
    galore_->step_projected_gradient(p, R);
    return;
  }
  if (!p.grad().defined()) return;
  clip(index, p.grad(), canonical_norm(p.grad()));
  optimizer_.step_param(p);
  p.set_grad(Tensor());
}

void LayerwiseUpdater::step_summed(std::size_t index, Tensor target, double norm) {
  MT_CHECK(index < params_.size(), "LayerwiseUpdater", "parameter {} of {}", index, params_.size());
  squares_[index] = norm * norm;  // every rank counts the whole parameter, whatever it holds of it
  if (!target.defined() || !target.grad().defined()) return;
  if (!std::isfinite(norm)) {  // skipped on every rank, though this rank's shard may be finite
    target.set_grad(Tensor());
    return;
  }
  clip(index, target.grad(), norm);
  optimizer_.step_param(target);
  target.set_grad(Tensor());
}

double LayerwiseUpdater::finish_step() {
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const Tensor& p = params_[k];
    const bool pending = galore_ && galore_->is_projected(p) && galore_->has_accumulated(p);
    if (pending || p.grad().defined()) step_now(k);
  }
  double total = 0.0;
  for (const double s : squares_) total += s;
  return std::sqrt(total);
}

}  // namespace memtrain::train::detail
