// LISA (Pan et al. 2024, "Layerwise Importance Sampling"; TrainerConfig.lisa_layers): the parameters outside
// the model's numbered blocks (embeddings, final norm, head) always train; of the blocks ("h.3", "layers.7":
// the name up to its first all-digit component), lisa_layers are active at a time, drawn uniformly without
// replacement every lisa_interval steps. The other blocks are frozen (requires_grad false: no weight
// gradients in the backward, nothing for the optimizer), and a block that leaves the active set has its
// optimizer state freed at once, so the state held is the always-trained parameters' plus the active blocks'.
// A block drawn again starts from fresh state. LMFlow's implementation keeps every block's state once it has
// been active (LMFlow #729, #768); this is the difference.
//
// The draw for period k = step / lisa_interval depends only on (seed, k), so a resumed run draws what the
// original drew; the optimizer state a checkpoint holds is that of the blocks active when it was written.
//
// Under bf16 / fp16 / fp8 (frozen_dtype other than the parameters' own) a frozen block is also stored in the
// compute dtype, as LoRA's frozen base is: autocast computes with that copy anyway, and only the active blocks
// keep their f32 masters. A block that leaves the active set is rounded to the compute dtype then (its low
// mantissa bits go, as they would in a bf16 model), and widened back, exactly, when it is drawn again.
#pragma once

#include "memtrain/nn/module.h"
#include "memtrain/optim/optimizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::train::detail {

class Lisa {
 public:
  // Refuses (naming the counts) a model without numbered blocks, or active_blocks outside [1, blocks].
  Lisa(const nn::Module& model, std::int64_t active_blocks, std::int64_t interval, std::uint64_t seed,
       DType frozen_dtype);

  // Before step `step` (0-based): on entering a new period, draws its blocks, freezes the others (their
  // gradients dropped) and frees their optimizer state. Returns true when the active set changed.
  bool before_step(std::int64_t step, optim::Optimizer& optimizer);

  const std::vector<std::int64_t>& active() const { return active_; }  // block indices, ascending
  const std::vector<std::string>& block_names() const { return names_; }
  // The blocks drawn for period k (ascending): the first `active_blocks` of a seeded Fisher-Yates shuffle.
  std::vector<std::int64_t> draw(std::int64_t period) const;

 private:
  std::vector<std::string> names_;           // "h.0", "h.1", ...
  std::vector<std::vector<Tensor>> blocks_;  // each block's parameters
  std::vector<std::vector<DType>> master_dtypes_;  // their dtypes while active
  DType frozen_dtype_;
  std::int64_t active_blocks_;
  std::int64_t interval_;
  std::uint64_t seed_;
  std::int64_t period_ = -1;  // the period whose draw is in force; -1 before the first step
  std::vector<std::int64_t> active_;
};

}  // namespace memtrain::train::detail
