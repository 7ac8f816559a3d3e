// LoRA adapters on disk in Hugging Face PEFT's layout, so that PEFT loads what memtrain trains and memtrain
// loads what PEFT trains. A directory holds
//   adapter_model.safetensors  "base_model.model.<HF module path>.lora_A.weight" [r, in] and ".lora_B.weight"
//                              [out, r] for every adapted layer, metadata {"format": "pt"}
//   adapter_config.json        peft_type "LORA", r, lora_alpha, lora_dropout, use_rslora, bias "none",
//                              target_modules (the adapted layers' full HF paths), fan_in_fan_out, task_type
// A and B are stored as they are whether HF's layer is a Linear or GPT-2's Conv1D (PEFT keeps nn.Linear-shaped
// A and B for both). Module paths map to the HF model's names: GPT "h.0.attn.c_attn" is GPT2LMHeadModel's
// "transformer.h.0.attn.c_attn"; LLaMA "layers.0.self_attn.q_proj" is LlamaForCausalLM's
// "model.layers.0.self_attn.q_proj" and "lm_head" stays; any other model's paths are used as they are.
#pragma once

#include "memtrain/nn/lora_config.h"
#include "memtrain/nn/module.h"

#include <string>

namespace memtrain::nn {

// The HF name of one of the model's module paths (above).
std::string hf_module_path(const Module& model, const std::string& path);

// Writes the model's adapters (nn::lora_layers) and `config`'s settings into `dir` (created when missing), each
// file atomically. Throws when the model has no adapter, or when one is merged (its A and B would be applied
// twice by whoever loads it).
void save_lora_adapter(const Module& model, const LoraConfig& config, const std::string& dir);

// The settings of the adapter in `dir`, for `model`: r, lora_alpha, lora_dropout, use_rslora, and as targets the
// model paths of the layers the file holds adapters for (exact paths). Refused, naming the file and the key:
// a peft_type other than LORA, bias other than "none", DoRA, modules_to_save, rank_pattern or alpha_pattern
// (per-layer ranks), a tensor that is not a layer's lora_A / lora_B weight.
LoraConfig read_lora_adapter_config(const Module& model, const std::string& dir);

// Copies the adapter in `dir` into the model's adapters, which must be the same layers with the same rank and
// scaling (apply_lora with read_lora_adapter_config gives them). Everything is checked before anything is
// copied; one memtrain::Error names the directory and every missing or unexpected key, and each mismatched
// tensor with both shapes.
void load_lora_adapter(Module& model, const std::string& dir);

}  // namespace memtrain::nn
