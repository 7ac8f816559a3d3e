// LLaMA self-attention: q_proj, k_proj, v_proj, o_proj [C, C] without bias; q and k are rotated by the shared
// RotaryEmbedding after splitting into heads [B, H, T, D]; causal ops::scaled_dot_product_attention (scale
// 1/sqrt(D)); merge heads; o_proj. No dropout (LLaMA has none).
#pragma once

#include "memtrain/nn/linear.h"
#include "memtrain/nn/rotary.h"

#include <memory>

namespace memtrain::nn {

class LlamaAttention : public Module {
 public:
  LlamaAttention(std::int64_t n_embd, std::int64_t n_head, std::shared_ptr<const RotaryEmbedding> rotary,
                 DType dtype = DType::f32);
  Tensor forward(const Tensor& x) const;  // x [B, T, C] -> [B, T, C]

 private:
  std::int64_t n_embd_;
  std::int64_t n_head_;
  std::shared_ptr<const RotaryEmbedding> rotary_;
  std::shared_ptr<Linear> q_proj_;
  std::shared_ptr<Linear> k_proj_;
  std::shared_ptr<Linear> v_proj_;
  std::shared_ptr<Linear> o_proj_;
};

}  // namespace memtrain::nn
