// Fp8State: the FP8 recipe of a training run and the delayed-scaling state of each linear layer, keyed by the
// layer's weight. amp::Autocast(Fp8State&) routes every linear through amp::fp8_linear with it; the Trainer
// owns one for precision "fp8" and calls update_scales() after each step.
//
// Blockwise scaling needs no state (meta_for returns null). Delayed scaling makes one Fp8LinearMeta per weight at
// its first use: input, weight and output-gradient amax histories (history_len entries each, 16 by default).
#pragma once

#include "memtrain/amp/fp8_linear.h"

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace memtrain::amp {

// "delayed" or "blockwise"; anything else throws, listing both.
Fp8ScalingKind fp8_scaling_from_name(std::string_view name);
std::string fp8_scaling_name(Fp8ScalingKind kind);

class Fp8State {
 public:
  explicit Fp8State(Fp8Recipe recipe = {});

  const Fp8Recipe& recipe() const { return recipe_; }
  // The delayed-scaling state of the linear layer whose weight this is (made at its first use); null for
  // blockwise scaling.
  Fp8LinearMeta* meta_for(const Tensor& weight);
  // After each optimizer step (delayed): every layer's scales from its amax histories.
  void update_scales();
  // Data parallel: this step's amaxes (input, weight and grad of each layer of `weights` that has state, in that
  // order). merge_step_amaxes takes every rank's list, one after another, and folds them into the current slots,
  // so each rank's slots hold the max over all ranks' micro-batches (NaN sticks): what a run alone over the whole
  // global batch records, and the same scales on every rank after update_scales.
  std::vector<double> step_amaxes(const std::vector<Tensor>& weights) const;
  void merge_step_amaxes(const std::vector<Tensor>& weights, const std::vector<double>& all_ranks);
  std::size_t layers() const { return metas_.size(); }
  std::size_t bytes() const;  // scaling state of all layers

  // For checkpoint files, by weight name: "<prefix>.<name>.{input,weight,grad}.{amax_history,scale}" for each
  // weight of `weights` that has delayed-scaling state. load replaces the state with the file's (weights without
  // entries start fresh); it throws, changing nothing, on a malformed entry or on "<prefix>." entries for a
  // name that is not in `weights`.
  using NamedWeights = std::vector<std::pair<std::string, Tensor>>;
  void save(std::map<std::string, Tensor>& out, const std::string& prefix, const NamedWeights& weights) const;
  void load(const std::map<std::string, Tensor>& in, const std::string& prefix, const NamedWeights& weights);

 private:
  struct Entry {
    std::shared_ptr<TensorImpl> weight;  // keeps the key's object alive
    Fp8LinearMeta meta;
  };
  Fp8Recipe recipe_;
  std::unordered_map<const TensorImpl*, Entry> metas_;
};

}  // namespace memtrain::amp
