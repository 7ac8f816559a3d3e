#include "memtrain/nn/llama_config.h"

#include "memtrain/core/error.h"

#include <fmt/ranges.h>

#include <string>
#include <vector>

namespace memtrain::nn {

namespace {

struct LlamaPreset {
  const char* name;
  std::int64_t vocab_size, block_size, n_layer, n_head, n_embd, intermediate_size;
};

// The sizes of the GaLore paper's LLaMA family (llama-60M ... llama-7B) and a tiny one for tests.
constexpr LlamaPreset kPresets[] = {
    {"llama-tiny", 512, 64, 2, 4, 64, 172},          {"llama-60M", 32000, 1024, 8, 8, 512, 1376},
    {"llama-130M", 32000, 1024, 12, 12, 768, 2048},  {"llama-350M", 32000, 1024, 24, 16, 1024, 2736},
    {"llama-1B", 32000, 1024, 24, 32, 2048, 5461},   {"llama-7B", 32000, 2048, 32, 32, 4096, 11008},
};

}  // namespace

LlamaConfig LlamaConfig::preset(const std::string& name) {
  std::vector<std::string> known;
  for (const LlamaPreset& p : kPresets) {
    if (name != p.name) {
      known.emplace_back(p.name);
      continue;
    }
    LlamaConfig c;
    c.vocab_size = p.vocab_size, c.block_size = p.block_size, c.n_layer = p.n_layer, c.n_head = p.n_head;
    c.n_embd = p.n_embd, c.intermediate_size = p.intermediate_size;
    return c;
  }
  MT_CHECK(false, "LlamaConfig::preset", "unknown preset '{}' (known: {})", name, fmt::join(known, ", "));
  return {};
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
