#include "memtrain/nn/llama_decoder_layer.h"

#include "memtrain/ops/elementwise.h"

namespace memtrain::nn {

LlamaDecoderLayer::LlamaDecoderLayer(std::int64_t n_embd, std::int64_t n_head, std::int64_t intermediate_size,
                                     double rms_norm_eps, std::shared_ptr<const RotaryEmbedding> rotary, DType dtype) {
  // Registration order is HF's LlamaDecoderLayer: self_attn, mlp, input_layernorm, post_attention_layernorm.
  self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(n_embd, n_head, std::move(rotary), dtype));
  mlp_ = register_module("mlp", std::make_shared<SwiGLU>(n_embd, intermediate_size, dtype));
  input_layernorm_ = register_module("input_layernorm", std::make_shared<RMSNorm>(n_embd, rms_norm_eps, dtype));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(n_embd, rms_norm_eps, dtype));
}

Tensor LlamaDecoderLayer::forward(const Tensor& x) const {
  Tensor h = x + self_attn_->forward(input_layernorm_->forward(x));
  return h + mlp_->forward(post_attention_layernorm_->forward(h));
}

}  // namespace memtrain::nn
