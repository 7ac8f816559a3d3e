// LoRA (Hu et al. 2021) over a model's Linear layers, chosen by name, with Hugging Face PEFT's conventions:
// the adapter of layer "h.0.attn.c_attn" is "h.0.attn.c_attn.lora_A.weight" [r, in] and ".lora_B.weight"
// [out, r]; A starts Kaiming-uniform and B at zero, so a model with fresh adapters computes exactly what it
// computed before; the update is scaled by alpha / r (rsLoRA: alpha / sqrt(r)); dropout acts on A's input.
// Every other parameter of the model is frozen (PEFT's bias "none"): the optimizer gets only A and B, and no
// gradient or optimizer state exists for the base.
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/nn/linear.h"
#include "memtrain/nn/lora_config.h"
#include "memtrain/nn/module.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace memtrain::nn {

using NamedLinears = std::vector<std::pair<std::string, std::shared_ptr<Linear>>>;

// Every Linear in the model by its module path ("h.0.attn.c_attn"), in registration order, adapters' own A and B
// layers left out.
NamedLinears named_linears(const Module& model);

// The Linears `config.targets` chooses. Throws memtrain::Error("LoRA", ...) when a pattern matches no Linear,
// naming the pattern and listing the Linears the model has.
NamedLinears lora_targets(const Module& model, const LoraConfig& config);

// Adds an adapter (Linear::add_lora) to each chosen Linear, storing its frozen weight and bias in
// `base_dtype`, and freezes every other parameter of the model (requires_grad false, gradients dropped).
// Returns the adapted layers. Throws, before changing anything, when config is invalid or disabled, a
// pattern matches nothing, or a chosen layer has an adapter already.
NamedLinears apply_lora(Module& model, const LoraConfig& config, DType base_dtype = DType::f32);

// The layers of the model that have an adapter.
NamedLinears lora_layers(const Module& model);

// Linear::merge_lora / unmerge_lora on every adapted layer (for inference, or to save a plain model), or on
// the model itself when it is a Linear. Throw when the model has no adapter.
void merge_lora(Module& model);
void unmerge_lora(Module& model);

}  // namespace memtrain::nn
