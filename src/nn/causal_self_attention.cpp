#include "memtrain/nn/causal_self_attention.h"

#include "memtrain/ckpt/op_label.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/shape.h"

#include <cmath>
#include <vector>

namespace memtrain::nn {

CausalSelfAttention::CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, std::int64_t n_layer, bool bias,
                                         double dropout, DType dtype, const TensorShard& shard)
    : n_embd_(n_embd), shard_(shard) {
  const char* where = "nn::CausalSelfAttention";
  MT_CHECK(n_head > 0 && n_embd % n_head == 0, where, "n_embd {} must be a positive multiple of n_head {}", n_embd,
           n_head);
  MT_CHECK(n_layer > 0, where, "n_layer must be positive, got {}", n_layer);
  MT_CHECK(shard.count >= 1 && n_head % shard.count == 0, where,
           "{} heads cannot be split over {} tensor-parallel ranks", n_head, shard.count);
  n_head_ = n_head / shard.count;
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
  if (!shard.split()) {
    c_attn_ = register_module("c_attn", std::make_shared<Linear>(n_embd, 3 * n_embd, bias, dtype));
    c_proj_ = register_module("c_proj", std::make_shared<Linear>(n_embd, n_embd, bias, dtype, proj_std));
  } else {
    // This rank's heads are channels [a, b) of each of q, k and v, and the same inputs of c_proj.
    const auto [a, b] = shard.even_part(n_embd);
    const std::vector<Range> qkv_rows{{a, b}, {n_embd + a, n_embd + b}, {2 * n_embd + a, 2 * n_embd + b}};
    c_attn_ = register_module("c_attn", make_linear_part(n_embd, 3 * n_embd, bias, dtype, 0.02, qkv_rows, {0, n_embd}));
    c_proj_ = register_module("c_proj",
                              make_linear_part(n_embd, n_embd, bias, dtype, proj_std, {{0, n_embd}}, {a, b}));
  }
  resid_dropout_ = register_module("resid_dropout", std::make_shared<Dropout>(dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  MT_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "nn::CausalSelfAttention",
           "expected x [B, T, {}], got {}", n_embd_, shape_str(x.shape()));
  // C: this rank's channels (all of them alone), H of its heads, D per head.
  const std::int64_t B = x.size(0), T = x.size(1), C = n_embd_ / shard_.count, H = n_head_, D = C / H;
  const Tensor in = column_parallel_input(x, shard_);
  // Labelled so that selective checkpointing can keep one projection and recompute the other (op_label.h).
  const Tensor qkv = ckpt::labelled("attn.qkv", [&] { return c_attn_->forward(in); });  // (B,T,3C): its q, k, v
  std::vector<Tensor> parts = ops::split(qkv, {C, C, C}, -1);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };  // (B,H,T,D)
  Tensor y = ops::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), true);
  y = y.transpose(1, 2).reshape({B, T, C});  // (B,T,C)
  return resid_dropout_->forward(
      ckpt::labelled("attn.proj", [&] { return row_parallel_forward(*c_proj_, y, shard_); }));  // (B,T,n_embd)
}

}  // namespace memtrain::nn
