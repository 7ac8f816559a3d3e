// LoraConfig: the settings of LoRA (nn/lora.h), a plain value that TrainerConfig holds and its JSON carries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::nn {

struct LoraConfig {
  std::int64_t rank = 0;  // r; 0 = no LoRA
  double alpha = 8.0;     // PEFT's lora_alpha
  double dropout = 0.0;   // PEFT's lora_dropout, on A's input
  bool rslora = false;    // scale by alpha / sqrt(r) instead of alpha / r
  // QLoRA: the frozen weights of the adapted layers stored in NF4 with double-quantised absmax (ops/nf4.h,
  // 4.127 bits a weight) instead of the compute dtype. Their element counts must be multiples of 64.
  bool quantize_nf4 = false;
  // Which Linears get an adapter. A pattern matches a module path when it equals the path or its last
  // dot-separated components ("c_attn" matches "h.0.attn.c_attn", as PEFT's target_modules do), or, when it
  // holds '*', when it matches the whole path with '*' as any run of characters ("h.1*.mlp.*"). Empty: every
  // Linear inside a numbered block (a path with an all-digit component: "h.3.mlp.c_fc", "layers.0.self_attn.
  // q_proj"), which leaves out a separate head (llama's lm_head) and a CNN's classifier.
  std::vector<std::string> targets;

  bool enabled() const { return rank > 0; }
  double scaling() const;  // alpha / r, or alpha / sqrt(r)
  // Throws memtrain::Error("LoraConfig", ...) naming the field: rank >= 0, alpha finite and non-zero when
  // rank > 0, dropout in [0, 1), no empty pattern.
  void validate() const;
};

}  // namespace memtrain::nn
