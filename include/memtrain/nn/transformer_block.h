// Pre-LayerNorm transformer block (GPT-2): x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). With a TensorShard of
// count > 1 the attention and the MLP hold this rank's part (nn/tensor_shard.h); the layer norms are whole.
#pragma once

#include "memtrain/nn/causal_self_attention.h"
#include "memtrain/nn/layer_norm.h"
#include "memtrain/nn/mlp.h"

#include <memory>

namespace memtrain::nn {

class TransformerBlock : public Module {
 public:
  TransformerBlock(std::int64_t n_embd, std::int64_t n_head, std::int64_t n_layer, bool bias = true,
                   double dropout = 0.0, DType dtype = DType::f32, const TensorShard& shard = {});
  Tensor forward(const Tensor& x) const;  // x [B, T, C] -> [B, T, C]

 private:
  std::shared_ptr<LayerNorm> ln_1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln_2_;
  std::shared_ptr<MLP> mlp_;
};

}  // namespace memtrain::nn
