#include "memtrain/nn/gpt_config.h"

#include "memtrain/core/error.h"

namespace memtrain::nn {

GPTConfig GPTConfig::preset(const std::string& name) {
  GPTConfig c;
  if (name == "tiny") {
    c.vocab_size = 512, c.block_size = 64, c.n_layer = 2, c.n_head = 2, c.n_embd = 64;
  } else if (name == "mini") {
    c.vocab_size = 4096, c.block_size = 128, c.n_layer = 4, c.n_head = 4, c.n_embd = 256;
  } else if (name == "small") {
    c.vocab_size = 8192, c.block_size = 256, c.n_layer = 6, c.n_head = 6, c.n_embd = 384;
  } else if (name == "gpt2-124M") {
    c.vocab_size = 50257, c.block_size = 1024, c.n_layer = 12, c.n_head = 12, c.n_embd = 768;
  } else {
    MT_CHECK(false, "GPTConfig::preset", "unknown preset '{}' (known: tiny, mini, small, gpt2-124M)", name);
  }
  return c;
}

void GPTConfig::validate() const {
  MT_CHECK(vocab_size > 0 && block_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0, "GPTConfig",
           "sizes must be positive: vocab_size {} block_size {} n_layer {} n_head {} n_embd {}", vocab_size,
           block_size, n_layer, n_head, n_embd);
  MT_CHECK(n_embd % n_head == 0, "GPTConfig", "n_embd {} is not divisible by n_head {}", n_embd, n_head);
  MT_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig", "dropout must be in [0, 1), got {}", dropout);
}

}  // namespace memtrain::nn
