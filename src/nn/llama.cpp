#include "memtrain/nn/llama.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"

#include <fmt/format.h>

namespace memtrain::nn {

Llama::Llama(const LlamaConfig& config, DType dtype) : config_(config) {
  config_.validate();
  const auto& c = config_;
  rotary_ = std::make_shared<const RotaryEmbedding>(c.n_embd / c.n_head, c.block_size, c.rope_theta, dtype);
  // Registration order is HF's: embed_tokens, layers, norm, then lm_head.
  embed_tokens_ = register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.n_embd, dtype));
  for (std::int64_t i = 0; i < c.n_layer; ++i)
    layers_.push_back(register_module(
        fmt::format("layers.{}", i),
        std::make_shared<LlamaDecoderLayer>(c.n_embd, c.n_head, c.intermediate_size, c.rms_norm_eps, rotary_, dtype)));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(c.n_embd, c.rms_norm_eps, dtype));
  lm_head_ = register_module("lm_head", std::make_shared<Linear>(c.n_embd, c.vocab_size, false, dtype));
}

Tensor Llama::forward(const Tensor& idx) const {
  MT_CHECK(idx.dim() == 2, "Llama::forward", "expected idx [B, T], got {}", shape_str(idx.shape()));
  const std::int64_t T = idx.size(1);
  MT_CHECK(T >= 1 && T <= config_.block_size, "Llama::forward", "sequence length {} outside [1, block_size {}]", T,
           config_.block_size);
  Tensor x = embed_tokens_->forward(idx);  // (B,T,C); positions enter through the rotary q/k rotation
  const auto n = static_cast<std::int64_t>(layers_.size());
  for (std::int64_t i = 0; i < n; ++i) {
    x = run_block(i, n, [layer = layers_[i].get()](const Tensor& in) { return layer->forward(in); }, x);
  }
  return lm_head_->forward(norm_->forward(x));  // (B,T,V)
}

Tensor Llama::loss(const Tensor& idx, const Tensor& targets) const {
  MT_CHECK(targets.shape() == idx.shape(), "Llama::loss", "targets {} must match idx {}", shape_str(targets.shape()),
           shape_str(idx.shape()));
  Tensor logits = forward(idx);
  const std::int64_t N = idx.numel();
  return ops::cross_entropy(logits.reshape({N, config_.vocab_size}), targets.reshape({N}), ops::Reduction::mean,
                            -100);
}

}  // namespace memtrain::nn
