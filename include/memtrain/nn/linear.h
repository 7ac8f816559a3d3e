// Linear: y = x W^T + b with weight [out, in] and bias [out] (PyTorch layout; Hugging Face GPT-2's Conv1D
// stores [in, out], so a checkpoint loader transposes). Init as GPT-2: weight normal(0, init_std), bias zero.
//
// With a LoRA adapter (add_lora; nn/lora.h chooses the layers by name) the layer computes
//   y = x W^T + b + scaling * B(A(dropout(x)))
// with A [r, in] and B [out, r] registered as submodules "lora_A" and "lora_B" (Linears without bias), so the
// parameters are named as Hugging Face PEFT names them ("c_attn.lora_A.weight"). W and b are frozen. With
// QLoRA's storage W is kept in NF4 (ops/nf4.h) as buffers named as bitsandbytes names its 4-bit weights:
// "weight" (u8 codes), "weight.absmax" (u8), "weight.nested_absmax" (f32), "weight.nested_offset" (f32 [1]);
// the layer then computes x W^T tile by tile (ops::nf4_linear) and W at full precision never exists.
#pragma once

#include "memtrain/nn/module.h"
#include "memtrain/ops/nf4.h"

#include <memory>

namespace memtrain::nn {

class Dropout;

struct LoraSettings {
  std::int64_t rank = 8;
  double scaling = 1.0;  // alpha / r, or alpha / sqrt(r) for rsLoRA
  double dropout = 0.0;  // on A's input only
  bool quantize_nf4 = false;  // store W in NF4 instead of base_dtype
};

class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true, DType dtype = DType::f32,
         double init_std = 0.02);
  Tensor forward(const Tensor& x) const;  // x [..., in] -> [..., out]
  // The weight [out, in]; for an NF4-stored weight, its u8 codes (see nf4_weight()).
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }
  bool weight_is_nf4() const { return nf4_absmax_.defined(); }
  // The NF4 weight as ops::nf4_linear takes it (read from the buffers, so a loaded state_dict is seen).
  // Throws unless weight_is_nf4().
  ops::Nf4Weight nf4_weight() const;

  // Adds the adapter as PEFT initialises it (A Kaiming-uniform with a = sqrt(5), i.e. uniform +-1/sqrt(in);
  // B zero, so the output is unchanged bit for bit until B moves), freezes W and b (requires_grad false,
  // gradients dropped) and stores them in `base_dtype` (a frozen weight needs no f32 master: bf16 under bf16
  // autocast, where it would be cast to bf16 anyway). A and B are made in the weight's original dtype on its
  // device. With settings.quantize_nf4, W is quantised to NF4 instead (its element count a multiple of 64) and
  // base_dtype applies to b only. Throws when the layer has an adapter already or the settings are out of range.
  void add_lora(const LoraSettings& settings, DType base_dtype);
  bool has_lora() const { return lora_a_ != nullptr; }
  const LoraSettings& lora_settings() const { return lora_; }
  const std::shared_ptr<Linear>& lora_A() const { return lora_a_; }
  const std::shared_ptr<Linear>& lora_B() const { return lora_b_; }

  // merge: W <- W0 + scaling * B A (computed in f32, rounded once to W's dtype), and forward skips the adapter.
  // W0 is kept beside it (one more copy of W), so unmerge puts back exactly the bits W had: it is not recovered
  // by subtraction. Both throw without an adapter, and merge when merged already (unmerge when not merged);
  // merge throws for an NF4 weight (the sum is not NF4: dequantise the model to merge it).
  void merge_lora();
  void unmerge_lora();
  bool lora_merged() const { return unmerged_weight_.defined(); }

 private:
  std::int64_t in_features_, out_features_;
  Tensor weight_;
  Tensor bias_;
  Tensor nf4_absmax_, nf4_scales_, nf4_offset_;  // with an NF4 weight: its other buffers
  LoraSettings lora_;
  std::shared_ptr<Linear> lora_a_;
  std::shared_ptr<Linear> lora_b_;
  std::shared_ptr<Dropout> lora_dropout_;
  Tensor unmerged_weight_;  // W0 while merged
};

// PyTorch's nn.Linear default init, uniform +-1/sqrt(in) for weight and bias alike (weight first, from the
// default RNG stream), in place of GPT-2's normal(0, 0.02): what a small network trained from scratch expects.
void init_torch_default_(const Linear& lin);

}  // namespace memtrain::nn
