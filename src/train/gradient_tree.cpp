#include "train/gradient_tree.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"

#include <utility>

namespace memtrain::train::detail {

void GradientTree::merge_into(Subtree& left, Subtree&& right) {
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::gradients);
  for (std::size_t i = 0; i < left.grads.size(); ++i) {
    Tensor& l = left.grads[i];
    Tensor& r = right.grads[i];
    if (!r.defined()) continue;
    if (!l.defined()) {
      l = std::move(r);
    } else {
      l = l + r;  // not in place: a gradient autograd handed over may be shared with another parameter's
    }
    r = Tensor();  // freed now, not when the whole subtree goes
  }
  left.leaves += right.leaves;
}

void GradientTree::push_leaf() {
  Subtree leaf;
  leaf.leaves = 1;
  leaf.grads.reserve(params_.size());
  for (Tensor& p : params_) {
    leaf.grads.push_back(p.grad());
    p.set_grad(Tensor());
  }
  stack_.push_back(std::move(leaf));
  ++leaves_;
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].leaves == stack_.back().leaves) {
    Subtree right = std::move(stack_.back());
    stack_.pop_back();
    merge_into(stack_.back(), std::move(right));
  }
}

void GradientTree::finish() {
  while (stack_.size() >= 2) {
    Subtree right = std::move(stack_.back());
    stack_.pop_back();
    merge_into(stack_.back(), std::move(right));
  }
  if (!stack_.empty())
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].set_grad(stack_.back().grads[i]);
  stack_.clear();
  leaves_ = 0;
}

}  // namespace memtrain::train::detail
