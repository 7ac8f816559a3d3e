// Micro-batch gradients summed in the canonical tree order, so that a data-parallel step at any world size
// gives the same bits (TrainerConfig::canonical_reduction; always on when world_size > 1).
//
// The canonical tree over leaves [lo, lo + n) splits at p, the largest power of two below n: (tree over the
// first p) + (tree over the rest); dist::canonical_split is the same rule across ranks. Leaves arrive one by
// one, so this keeps a binary counter: a new leaf is pushed, two subtrees of equal size merge (left + right),
// and finish() folds what is left from the right. That is the canonical tree: the stack holds perfect subtrees
// of decreasing size, the binary digits of n, and the canonical split of n takes the largest of them first.
// A rank's block of 2^k micro-batches is one perfect subtree of the global tree, so summing blocks across
// ranks with the same rule completes the same tree.
//
// Memory: at most floor(log2(n)) + 1 gradient sets are alive at once (one for 1 micro-batch, two for 2,
// three for 4), against one for sequential accumulation into .grad.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>
#include <vector>

namespace memtrain::train::detail {

class GradientTree {
 public:
  explicit GradientTree(std::vector<Tensor> params) : params_(std::move(params)), completed_(params_.size()) {}
  // After a micro-batch's backward: its gradients (each parameter's .grad, cleared here) become a leaf.
  void push_leaf();
  // Folds the subtrees into each parameter's .grad (undefined where no leaf had a gradient); empties the tree.
  void finish();
  // For the last leaf, one parameter ahead of the others (from its gradient-ready hook, so its sum over the
  // ranks can start during the backward): its .grad, the last leaf, is folded with its subtrees into .grad
  // now, exactly as push_leaf() and finish() would. push_leaf() and finish() then leave it alone.
  void complete(std::size_t index);
  std::int64_t leaves() const { return leaves_; }

 private:
  struct Subtree {
    std::int64_t leaves = 0;
    std::vector<Tensor> grads;  // one per parameter; undefined = no gradient (zero)
  };
  std::vector<Tensor> params_;
  std::vector<Subtree> stack_;  // sizes strictly decreasing from the bottom, except just after a push
  std::vector<bool> completed_;  // by complete(), until finish()
  std::int64_t leaves_ = 0;
  static Tensor sum(const Tensor& left, const Tensor& right);  // undefined is zero
  static void merge_into(Subtree& left, Subtree&& right);  // left := left + right, element by element
};

}  // namespace memtrain::train::detail
