#include "train/gradient_tree.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"

#include <utility>

namespace memtrain::train::detail {

Tensor GradientTree::sum(const Tensor& left, const Tensor& right) {
  if (!right.defined()) return left;
  if (!left.defined()) return right;
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::gradients);
  return left + right;  // not in place: a gradient autograd handed over may be shared with another parameter's
}

void GradientTree::merge_into(Subtree& left, Subtree&& right) {
  for (std::size_t i = 0; i < left.grads.size(); ++i) {
    left.grads[i] = sum(left.grads[i], right.grads[i]);
    right.grads[i] = Tensor();  // freed now, not when the whole subtree goes
  }
  left.leaves += right.leaves;
}

void GradientTree::push_leaf() {
  Subtree leaf;
  leaf.leaves = 1;
  leaf.grads.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (completed_[i]) {
      leaf.grads.emplace_back();  // already folded: nothing of it is left in the tree
      continue;
    }
    leaf.grads.push_back(params_[i].grad());
    params_[i].set_grad(Tensor());
  }
  stack_.push_back(std::move(leaf));
  ++leaves_;
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].leaves == stack_.back().leaves) {
    Subtree right = std::move(stack_.back());
    stack_.pop_back();
    merge_into(stack_.back(), std::move(right));
  }
}

void GradientTree::complete(std::size_t index) {
  if (completed_[index]) return;
  // push_leaf's merges for this parameter alone (the new leaf absorbs equal-sized subtrees from the top),
  // then finish's fold from the right: the same additions in the same order.
  Tensor acc = params_[index].grad();
  std::int64_t size = 1;
  std::size_t i = stack_.size();
  for (; i > 0 && stack_[i - 1].leaves == size; --i) {
    acc = sum(stack_[i - 1].grads[index], acc);
    stack_[i - 1].grads[index] = Tensor();
    size += stack_[i - 1].leaves;
  }
  for (; i > 0; --i) {
    acc = sum(stack_[i - 1].grads[index], acc);
    stack_[i - 1].grads[index] = Tensor();
  }
  params_[index].set_grad(acc);
  completed_[index] = true;
}

void GradientTree::finish() {
  while (stack_.size() >= 2) {
    Subtree right = std::move(stack_.back());
    stack_.pop_back();
    merge_into(stack_.back(), std::move(right));
  }
  if (!stack_.empty())
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!completed_[i]) params_[i].set_grad(stack_.back().grads[i]);
  stack_.clear();
  completed_.assign(params_.size(), false);
  leaves_ = 0;
}

}  // namespace memtrain::train::detail
