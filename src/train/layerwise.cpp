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

namespace {

// L2 norm of a projected gradient, summed in double on its device as global_grad_norm does (a contiguous CPU
// f32 tensor is read in place).
double l2_norm(const Tensor& t) { return std::sqrt(sum_of_squares({t})); }

}  // namespace

LayerwiseUpdater::LayerwiseUpdater(optim::Optimizer& optimizer, double grad_clip)
    : optimizer_(optimizer), galore_(dynamic_cast<optim::GaLore*>(&optimizer)), grad_clip_(grad_clip) {
  double total = 0.0;
  for (const auto& g : optimizer_.param_groups()) {
    for (const Tensor& p : g.params) {
      params_.push_back(p);
      total += static_cast<double>(p.numel());
    }
  }
  for (const Tensor& p : params_)
    clip_to_[p.impl_ptr().get()] = grad_clip_ * std::sqrt(static_cast<double>(p.numel()) / total);
}

std::shared_ptr<LayerwiseUpdater> LayerwiseUpdater::install(optim::Optimizer& optimizer, double grad_clip) {
  std::shared_ptr<LayerwiseUpdater> updater(new LayerwiseUpdater(optimizer, grad_clip));
  const std::weak_ptr<LayerwiseUpdater> weak = updater;
  for (Tensor& p : updater->params_) {
    p.register_grad_ready_hook([weak](Tensor& param) {
      if (auto u = weak.lock()) u->on_ready(param);
    });
  }
  return updater;
}

LayerwiseUpdater::Backward::Backward(LayerwiseUpdater& updater, bool last) : updater_(updater) {
  updater_.active_ = true;
  updater_.last_ = last;
}

LayerwiseUpdater::Backward::~Backward() { updater_.active_ = false; }

void LayerwiseUpdater::begin_step() { sum_squares_ = 0.0; }

void LayerwiseUpdater::on_ready(const Tensor& param) {
  if (!active_) return;
  if (last_) {
    step_now(param);
  } else if (galore_ && galore_->is_projected(param)) {
    galore_->accumulate(param, param.grad());
    Tensor(param).set_grad(Tensor());
  }
  // Any other parameter keeps accumulating into .grad until the last micro-batch.
}

void LayerwiseUpdater::step_now(const Tensor& param) {
  Tensor p = param;
  const double clip_to = clip_to_.at(p.impl_ptr().get());
  if (galore_ && galore_->is_projected(p)) {
    Tensor R = galore_->projected_gradient(p, p.grad());
    p.set_grad(Tensor());  // G is spent: free it before the step's temporaries
    if (!R.defined()) {    // a non-finite gradient: skipped, as the ordinary step skips it
      sum_squares_ = std::numeric_limits<double>::quiet_NaN();
      return;
    }
    const double norm = l2_norm(R);
    sum_squares_ += norm * norm;
    if (grad_clip_ > 0.0 && std::isfinite(norm) && norm > clip_to) {
      autograd::NoGradGuard no_grad;
      ops::mul_(R, clip_to / (norm + 1e-6));
    }
    galore_->step_projected_gradient(p, R);
    return;
  }
  if (!p.grad().defined()) return;
  const double norm = grad_clip_ > 0.0 ? clip_grad_norm({p}, clip_to) : global_grad_norm({p});
  sum_squares_ += norm * norm;
  optimizer_.step_param(p);
  p.set_grad(Tensor());
}

double LayerwiseUpdater::finish_step() {
  for (const Tensor& p : params_) {
    const bool pending = galore_ && galore_->is_projected(p) && galore_->has_accumulated(p);
    if (pending || p.grad().defined()) step_now(p);
  }
  return std::sqrt(sum_squares_);
}

}  // namespace memtrain::train::detail
