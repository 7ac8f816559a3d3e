// The gradient-ready hooks of a data-parallel step (Trainer::set_gradient_sync installs them): during the
// backward of the step's last micro-batch, each parameter's gradient is folded into its final block sum as
// soon as autograd has it (GradientTree::complete) and handed to the GradientSync, whose buckets can then be
// summed over the ranks while the backward goes on. Outside an Active scope the hooks do nothing.
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/train/gradient_sync.h"
#include "train/gradient_tree.h"

#include <memory>
#include <vector>

namespace memtrain::train::detail {

class SyncHooks {
 public:
  // One hook per parameter, holding a weak pointer: a backward after the Trainer is gone does nothing.
  static std::shared_ptr<SyncHooks> install(const std::vector<Tensor>& params);

  class Active {
   public:
    Active(SyncHooks& hooks, GradientTree& tree, GradientSync& sync) : hooks_(hooks) {
      hooks_.tree_ = &tree;
      hooks_.sync_ = &sync;
    }
    ~Active() { hooks_.tree_ = nullptr; }
    Active(const Active&) = delete;
    Active& operator=(const Active&) = delete;

   private:
    SyncHooks& hooks_;
  };

 private:
  SyncHooks() = default;
  void on_ready(std::size_t index);
  GradientTree* tree_ = nullptr;
  GradientSync* sync_ = nullptr;
};

}  // namespace memtrain::train::detail
