#include "memtrain/nn/transformer_block.h"

#include "memtrain/ops/elementwise.h"

namespace memtrain::nn {

TransformerBlock::TransformerBlock(std::int64_t n_embd, std::int64_t n_head, std::int64_t n_layer, bool bias,
                                   double dropout, DType dtype, const TensorShard& shard) {
  // Registration order gives Hugging Face GPT-2's parameter order: ln_1, attn, ln_2, mlp.
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(n_embd, bias, 1e-5, dtype));
  attn_ = register_module(
      "attn", std::make_shared<CausalSelfAttention>(n_embd, n_head, n_layer, bias, dropout, dtype, shard));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(n_embd, bias, 1e-5, dtype));
  mlp_ = register_module("mlp", std::make_shared<MLP>(n_embd, n_layer, bias, dropout, dtype, shard));
}

Tensor TransformerBlock::forward(const Tensor& x) const {
  Tensor h = x + attn_->forward(ln_1_->forward(x));
  return h + mlp_->forward(ln_2_->forward(h));
}

}  // namespace memtrain::nn
