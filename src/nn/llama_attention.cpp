#include "memtrain/nn/llama_attention.h"

#include "memtrain/ckpt/op_label.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/nn.h"

namespace memtrain::nn {

LlamaAttention::LlamaAttention(std::int64_t n_embd, std::int64_t n_head, std::shared_ptr<const RotaryEmbedding> rotary,
                               DType dtype)
    : n_embd_(n_embd), n_head_(n_head), rotary_(std::move(rotary)) {
  MT_CHECK(n_head > 0 && n_embd % n_head == 0, "nn::LlamaAttention", "n_embd {} must be a positive multiple of n_head {}",
           n_embd, n_head);
  MT_CHECK(rotary_ != nullptr && rotary_->head_dim() == n_embd / n_head, "nn::LlamaAttention",
           "needs a RotaryEmbedding of head_dim {}", n_embd / n_head);
  q_proj_ = register_module("q_proj", std::make_shared<Linear>(n_embd, n_embd, false, dtype));
  k_proj_ = register_module("k_proj", std::make_shared<Linear>(n_embd, n_embd, false, dtype));
  v_proj_ = register_module("v_proj", std::make_shared<Linear>(n_embd, n_embd, false, dtype));
  o_proj_ = register_module("o_proj", std::make_shared<Linear>(n_embd, n_embd, false, dtype));
}

Tensor LlamaAttention::forward(const Tensor& x) const {
  MT_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "nn::LlamaAttention", "expected x [B, T, {}], got {}", n_embd_,
           shape_str(x.shape()));
  const std::int64_t B = x.size(0), T = x.size(1), C = n_embd_, H = n_head_, D = C / H;
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };  // (B,H,T,D)
  // Labelled so that selective checkpointing can tell the projections apart (op_label.h); without biases
  // they run as matmul, so keep lists name them "@attn.q" or "matmul@attn.q".
  const Tensor q = rotary_->apply(heads(ckpt::labelled("attn.q", [&] { return q_proj_->forward(x); })));
  const Tensor k = rotary_->apply(heads(ckpt::labelled("attn.k", [&] { return k_proj_->forward(x); })));
  const Tensor v = heads(ckpt::labelled("attn.v", [&] { return v_proj_->forward(x); }));
  const Tensor y = ops::scaled_dot_product_attention(q, k, v, true).transpose(1, 2).reshape({B, T, C});  // (B,T,C)
  return ckpt::labelled("attn.o", [&] { return o_proj_->forward(y); });                                   // (B,T,C)
}

}  // namespace memtrain::nn
