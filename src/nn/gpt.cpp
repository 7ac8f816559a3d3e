#include "memtrain/nn/gpt.h"

#include "memtrain/core/error.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"

#include <fmt/format.h>

namespace memtrain::nn {

GPT::GPT(const GPTConfig& config, DType dtype) : config_(config) {
  config_.validate();
  const auto& c = config_;
  wte_ = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd, dtype));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd, dtype));
  drop_ = register_module("drop", std::make_shared<Dropout>(c.dropout));
  // Blocks register as "h.0", "h.1", ... directly, which yields HF's dotted names without a list module.
  for (std::int64_t i = 0; i < c.n_layer; ++i)
    h_.push_back(register_module(fmt::format("h.{}", i),
                                 std::make_shared<TransformerBlock>(c.n_embd, c.n_head, c.n_layer, c.bias, c.dropout,
                                                                    dtype)));
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(c.n_embd, c.bias, 1e-5, dtype));
}

Tensor GPT::hidden(const Tensor& idx) const {
  MT_CHECK(idx.dim() == 2, "GPT::forward", "expected idx [B, T], got {}", shape_str(idx.shape()));
  const std::int64_t T = idx.size(1);
  MT_CHECK(T >= 1 && T <= config_.block_size, "GPT::forward", "sequence length {} outside [1, block_size {}]", T,
           config_.block_size);
  Tensor pos = arange(0.0, static_cast<double>(T), 1.0, DType::i64);            // (T)
  pos = pos.to(idx.device());                                                   // beside the token ids
  Tensor x = drop_->forward(wte_->forward(idx) + wpe_->forward(pos));           // (B,T,C)
  const auto n = static_cast<std::int64_t>(h_.size());
  for (std::int64_t i = 0; i < n; ++i) {
    x = run_block(i, n, [block = h_[i].get()](const Tensor& in) { return block->forward(in); }, x);
  }
  return ln_f_->forward(x);
}

Tensor GPT::forward(const Tensor& idx) const {
  const Tensor h = hidden(idx);                  // (B,T,C)
  return ops::matmul(h, wte_->weight().t());  // (B,T,V), tied head
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) const {
  MT_CHECK(targets.shape() == idx.shape(), "GPT::loss", "targets {} must match idx {}", shape_str(targets.shape()),
           shape_str(idx.shape()));
  const std::int64_t N = idx.numel();
  const Tensor h = hidden(idx);
  const Tensor& head = wte_->weight();
  // Under amp::Autocast h is bf16/f16; the fused head widens it and computes the loss in f32 either way.
  // The fused head takes x in f32, bf16 or f16 on the CPU and on CUDA, and a weight in f32 or x's dtype (bf16
  // parameters without an f32 master).
  const bool fused_dtype = h.dtype() == DType::f32 || h.dtype() == DType::bf16 || h.dtype() == DType::f16;
  if (fused_dtype && (head.dtype() == DType::f32 || head.dtype() == h.dtype())) {
    return ops::fused_linear_cross_entropy(h.reshape({N, config_.n_embd}), head, Tensor(), targets.reshape({N}),
                                           ops::Reduction::mean, -100, ops::fused_head_chunk_rows(config_.vocab_size));
  }
  const Tensor logits = ops::matmul(h, head.t());
  return ops::cross_entropy(logits.reshape({N, config_.vocab_size}), targets.reshape({N}), ops::Reduction::mean,
                            -100);
}

}  // namespace memtrain::nn
