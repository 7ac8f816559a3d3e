// BlockCheckpointedModule: the base of a model whose forward runs a sequence of blocks (GPT's transformer
// blocks, Llama's decoder layers, CNN's conv stages, EfficientNet's MBConv blocks) under activation
// checkpointing. It holds the model's ckpt::BlockCheckpointer, takes every policy that Module::set_checkpointing
// offers (none by default), and runs each block through it (run_block).
#pragma once

#include "memtrain/ckpt/policy.h"
#include "memtrain/nn/module.h"

#include <cstdint>
#include <functional>
#include <utility>

namespace memtrain::nn {

class BlockCheckpointedModule : public Module {
 public:
  // The policy the blocks run under and, for a budget policy, its plan once made.
  const ckpt::BlockCheckpointer& checkpointing() const { return checkpointer_; }
  // Exchanges the model's checkpointer (policy and any budget plan) with `other`: a benchmark that alternates
  // policies step by step keeps one checkpointer per policy, so a budget plan is made once, not at every switch.
  void swap_checkpointer(ckpt::BlockCheckpointer& other) { std::swap(checkpointer_, other); }

 protected:
  // fn(x) as block `block` of `num_blocks`, plain or as a checkpoint region, per the policy. Const, so that a
  // const forward can call it: the checkpointer is mutable because a budget policy plans on its first use.
  Tensor run_block(std::int64_t block, std::int64_t num_blocks, const std::function<Tensor(const Tensor&)>& fn,
                   const Tensor& x) const {
    return checkpointer_.run(block, num_blocks, fn, x);
  }

  // Takes every policy: the blocks run through checkpointer_.
  bool apply_checkpointing(const ckpt::Policy& policy) override {
    checkpointer_.set_policy(policy);
    return true;
  }

 private:
  mutable ckpt::BlockCheckpointer checkpointer_;
};

}  // namespace memtrain::nn
