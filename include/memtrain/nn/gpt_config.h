// GPTConfig: the sizes of a GPT-2-style model, with named presets.
//   "tiny"       V 512,   T 64,   L 2,  H 2,  C 64   (tests and smoke runs; a step well under a second)
//   "mini"       V 4096,  T 128,  L 4,  H 4,  C 256  (the train_gpt default: minutes on 2 CPU cores)
//   "small"      V 8192,  T 256,  L 6,  H 6,  C 384
//   "gpt2-124M"  V 50257, T 1024, L 12, H 12, C 768  (OpenAI GPT-2 small; loads Hugging Face checkpoints)
#pragma once

#include <cstdint>
#include <string>

namespace memtrain::nn {

struct GPTConfig {
  std::int64_t vocab_size = 512;
  std::int64_t block_size = 64;  // longest sequence (rows of wpe)
  std::int64_t n_layer = 2;
  std::int64_t n_head = 2;
  std::int64_t n_embd = 64;
  double dropout = 0.0;
  bool bias = true;  // biases in every Linear and LayerNorm (GPT-2 has them)

  // Throws memtrain::Error for an unknown name (the message lists the known ones).
  static GPTConfig preset(const std::string& name);
  void validate() const;  // positive sizes, n_embd divisible by n_head, 0 <= dropout < 1
};

}  // namespace memtrain::nn
