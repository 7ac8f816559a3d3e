// LlamaConfig: the sizes of a LLaMA-style model (RMSNorm pre-norm, rotary attention without biases, SwiGLU
// MLP, untied head), with named presets.
//   "llama-tiny"  V 512,   T 64,   L 2,  H 4,  C 64,  intermediate 172  (tests and smoke runs; 8C/3 rounded
//                                                                      up to a multiple of 4)
//   "llama-60M"   V 32000, T 1024, L 8,  H 8,  C 512, intermediate 1376 (GaLore's llama_60m: 58.1M params)
//   "llama-130M"  V 32000, T 1024, L 12, H 12, C 768, intermediate 2048 (GaLore's llama_130m: 134.1M params)
//   "llama-350M"  V 32000, T 1024, L 24, H 16, C 1024, intermediate 2736 (GaLore's llama_350m: 368.0M params)
//   "llama-1B"    V 32000, T 1024, L 24, H 32, C 2048, intermediate 5461 (GaLore's llama_1b: 1339.1M params)
//   "llama-7B"    V 32000, T 2048, L 32, H 32, C 4096, intermediate 11008 (LLaMA-7B shapes: 6738.4M params)
// GaLore's configs allow 1024 positions (max_position_embeddings) and train with sequences of 256; T only
// sizes the rotary tables here, so a run picks its own sequence length <= T.
#pragma once

#include <cstdint>
#include <string>

namespace memtrain::nn {

struct LlamaConfig {
  std::int64_t vocab_size = 512;
  std::int64_t block_size = 64;  // longest sequence (rows of the rotary tables)
  std::int64_t n_layer = 2;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 64;
  std::int64_t intermediate_size = 172;  // SwiGLU hidden width
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;

  // Throws memtrain::Error for an unknown name (the message lists the known ones).
  static LlamaConfig preset(const std::string& name);
  // Positive sizes, n_embd divisible by n_head with an even head dim (rotary pairs), eps > 0, theta > 1.
  void validate() const;
};

}  // namespace memtrain::nn
