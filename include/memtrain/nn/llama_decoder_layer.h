// LLaMA decoder layer (pre-RMSNorm): x = x + self_attn(input_layernorm(x));
//                                    x = x + mlp(post_attention_layernorm(x)).
#pragma once

#include "memtrain/nn/llama_attention.h"
#include "memtrain/nn/rms_norm.h"
#include "memtrain/nn/swiglu.h"

#include <memory>

namespace memtrain::nn {

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(std::int64_t n_embd, std::int64_t n_head, std::int64_t intermediate_size, double rms_norm_eps,
                    std::shared_ptr<const RotaryEmbedding> rotary, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) const;  // x [B, T, C] -> [B, T, C]

 private:
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<SwiGLU> mlp_;
  std::shared_ptr<RMSNorm> input_layernorm_;
  std::shared_ptr<RMSNorm> post_attention_layernorm_;
};

}  // namespace memtrain::nn
