// The Trainer's part of tensor parallelism (train/tensor_parallel.h): attaching the group and the global norm.
#include "memtrain/train/tensor_parallel.h"

#include "memtrain/core/error.h"
#include "memtrain/train/trainer.h"
#include "train/grad_norm.h"

#include <algorithm>
#include <cmath>

namespace memtrain::train {

void Trainer::attach_tensor_parallel(std::shared_ptr<TensorParallelLink> link, const std::vector<Tensor>& split) {
  const char* where = "Trainer::attach_tensor_parallel";
  MT_CHECK(link != nullptr, where, "the link is null");
  MT_CHECK(step_ == 0, where, "attach before the first step (this trainer has run {})", step_);
  MT_CHECK(config_.tensor_parallel == link->size(), where,
           "config.tensor_parallel is {} but the group has {} ranks", config_.tensor_parallel, link->size());
  const std::vector<Tensor> trained = trained_params();
  split_params_.clear();
  for (const Tensor& t : split) {
    const bool known = std::any_of(trained.begin(), trained.end(),
                                   [&](const Tensor& p) { return p.impl_ptr() == t.impl_ptr(); });
    MT_CHECK(known || !t.requires_grad(), where, "a split parameter of shape {} is not one this trainer trains",
             shape_str(t.shape()));
    split_params_.insert(t.impl_ptr().get());
  }
  tensor_parallel_ = std::move(link);
}

double Trainer::tensor_parallel_norm(const std::vector<Tensor>& params, std::vector<Tensor>& grads) const {
  // Each rank's parts are disjoint pieces of the whole parameters: their squares add over the ranks (in rank
  // order, so every rank gets the same bits); the whole parameters are alike everywhere and count once.
  std::vector<Tensor> parts, whole;
  for (const Tensor& p : params) {
    (split_params_.count(p.impl_ptr().get()) > 0 ? parts : whole).push_back(p.grad());
    grads.push_back(p.grad());
  }
  double squares = 0.0;
  for (const double s : tensor_parallel_->gather_f64({detail::sum_of_squares(parts)})) squares += s;
  return std::sqrt(squares + detail::sum_of_squares(whole));
}

}  // namespace memtrain::train
