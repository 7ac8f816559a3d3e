// GPT-2 causal self-attention: c_attn [3C, C] -> split q, k, v -> heads [B, H, T, D] -> causal
// ops::scaled_dot_product_attention (flash-style, no T x T matrix stored) -> merge heads -> c_proj [C, C]
// -> dropout on the output. There is no dropout on the attention probabilities: the fused attention op has
// none (dropout 0 there is what nanoGPT uses with flash attention as well).
//
// With a TensorShard of count T > 1 (nn/tensor_shard.h) the layer holds n_head / T heads: c_attn's q, k and v
// rows for them ([3C/T, C], column-parallel: its input passes through tensor_parallel_copy) and c_proj's
// columns for them ([C, C/T], row-parallel: its partial outputs are summed over the group, then the whole bias
// is added).
#pragma once

#include "memtrain/nn/dropout.h"
#include "memtrain/nn/linear.h"
#include "memtrain/nn/tensor_shard.h"

#include <memory>

namespace memtrain::nn {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, std::int64_t n_layer, bool bias = true,
                      double dropout = 0.0, DType dtype = DType::f32, const TensorShard& shard = {});
  Tensor forward(const Tensor& x) const;  // x [B, T, C] -> [B, T, C]

 private:
  std::int64_t n_embd_;
  std::int64_t n_head_;  // the heads this rank holds
  TensorShard shard_;
  std::shared_ptr<Linear> c_attn_;
  std::shared_ptr<Linear> c_proj_;
  std::shared_ptr<Dropout> resid_dropout_;
};

}  // namespace memtrain::nn
