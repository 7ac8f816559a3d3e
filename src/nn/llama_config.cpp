#include "memtrain/nn/llama_config.h"

#include "memtrain/core/error.h"

namespace memtrain::nn {

LlamaConfig LlamaConfig::preset(const std::string& name) {
  LlamaConfig c;
  if (name == "llama-tiny") {
    c.vocab_size = 512, c.block_size = 64, c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.intermediate_size = 172;
  } else if (name == "llama-60M") {
    c.vocab_size = 32000, c.block_size = 1024, c.n_layer = 8, c.n_head = 8, c.n_embd = 512;
    c.intermediate_size = 1376;
  } else if (name == "llama-130M") {
    c.vocab_size = 32000, c.block_size = 1024, c.n_layer = 12, c.n_head = 12, c.n_embd = 768;
    c.intermediate_size = 2048;
  } else if (name == "llama-350M") {
    c.vocab_size = 32000, c.block_size = 1024, c.n_layer = 24, c.n_head = 16, c.n_embd = 1024;
    c.intermediate_size = 2736;
  } else if (name == "llama-1B") {
    c.vocab_size = 32000, c.block_size = 1024, c.n_layer = 24, c.n_head = 32, c.n_embd = 2048;
    c.intermediate_size = 5461;
  } else if (name == "llama-7B") {
    c.vocab_size = 32000, c.block_size = 2048, c.n_layer = 32, c.n_head = 32, c.n_embd = 4096;
    c.intermediate_size = 11008;
  } else {
    MT_CHECK(false, "LlamaConfig::preset", "unknown preset '{}' (known: llama-tiny, llama-60M, llama-130M, llama-350M, "
             "llama-1B, llama-7B)", name);
  }
  return c;
}

void LlamaConfig::validate() const {
  MT_CHECK(vocab_size > 0 && block_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0 && intermediate_size > 0,
           "LlamaConfig",
           "sizes must be positive: vocab_size {} block_size {} n_layer {} n_head {} n_embd {} intermediate_size {}",
           vocab_size, block_size, n_layer, n_head, n_embd, intermediate_size);
  MT_CHECK(n_embd % n_head == 0 && (n_embd / n_head) % 2 == 0, "LlamaConfig",
           "n_embd {} must split into n_head {} heads of an even size (rotary embeddings rotate pairs)", n_embd,
           n_head);
  MT_CHECK(rms_norm_eps > 0.0, "LlamaConfig", "rms_norm_eps must be positive, got {}", rms_norm_eps);
  MT_CHECK(rope_theta > 1.0, "LlamaConfig", "rope_theta must be > 1, got {}", rope_theta);
}

}  // namespace memtrain::nn
