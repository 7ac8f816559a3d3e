// Llama: a LLaMA-style decoder-only language model (Hugging Face LlamaForCausalLM without its label shift).
//   logits = lm_head(norm(layers_{L-1}(...layers_0(embed_tokens[idx]))))
// with pre-RMSNorm decoder layers (eps config.rms_norm_eps), rotary attention without biases (HF's
// rotate_half convention, theta config.rope_theta), a SwiGLU MLP and an untied lm_head [V, C].
//
// Parameter names are Hugging Face's with the "model." prefix dropped (lm_head.weight has none in HF):
//   embed_tokens.weight,
//   layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.mlp.{gate,up,down}_proj.weight,
//   layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight,
//   norm.weight, lm_head.weight
// so an HF checkpoint maps by stripping "model."; Linear weights are [out, in] as in HF (no transposes).
// The rotary cos/sin tables are not in state_dict. Init as HF LLaMA: every Linear and the embedding
// normal(0, 0.02), RMSNorm weights 1; drawn from the default RNG stream (manual_seed).
#pragma once

#include "memtrain/nn/block_checkpointed_module.h"
#include "memtrain/nn/embedding.h"
#include "memtrain/nn/linear.h"
#include "memtrain/nn/llama_config.h"
#include "memtrain/nn/llama_decoder_layer.h"
#include "memtrain/nn/rms_norm.h"
#include "memtrain/nn/rotary.h"

#include <memory>
#include <vector>

namespace memtrain::nn {

// Checkpointable blocks (BlockCheckpointedModule): the decoder layers, one region each.
class Llama : public BlockCheckpointedModule {
 public:
  explicit Llama(const LlamaConfig& config, DType dtype = DType::f32);
  // idx [B, T] integer, T <= block_size -> logits [B, T, V].
  Tensor forward(const Tensor& idx) const;
  // Mean cross entropy of forward(idx) against targets [B, T] (already shifted: targets[t] is the token after
  // idx[t]); targets equal to -100 are ignored.
  Tensor loss(const Tensor& idx, const Tensor& targets) const;
  const LlamaConfig& config() const { return config_; }
  const RotaryEmbedding& rotary() const { return *rotary_; }

 private:
  LlamaConfig config_;
  std::shared_ptr<const RotaryEmbedding> rotary_;
  std::shared_ptr<Embedding> embed_tokens_;
  std::vector<std::shared_ptr<LlamaDecoderLayer>> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Linear> lm_head_;
};

}  // namespace memtrain::nn
