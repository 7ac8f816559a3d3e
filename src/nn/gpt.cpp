#include "memtrain/nn/gpt.h"

#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/tensor_parallel_ops.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

namespace memtrain::nn {

std::int64_t GPTStage::block_parameters(const GPTConfig& c) {
  const std::int64_t C = c.n_embd, biases = c.bias ? 3 * C + C + 4 * C + C : 0;  // c_attn, c_proj, c_fc, c_proj
  return 12 * C * C + biases + 2 * (c.bias ? 2 : 1) * C;                      // + ln_1, ln_2
}

std::int64_t GPTStage::extra_parameters(const GPTConfig& c) const {
  std::int64_t extra = 0;
  if (index == 0) extra += c.block_size * c.n_embd;  // wpe (wte there is a frozen copy, unless one stage)
  if (index + 1 == count) extra += (c.vocab_size + (c.bias ? 2 : 1)) * c.n_embd;  // wte, ln_f
  return extra;
}

std::pair<std::int64_t, std::int64_t> GPTStage::blocks(const GPTConfig& c) const {
  const std::int64_t n = c.n_layer, block = block_parameters(c);
  if (count == 1) return {0, n};
  // best[s][k]: the smallest largest stage over stages 0..s-1 holding the first k blocks. Stages are few and
  // blocks tens, so the whole table costs nothing.
  const auto extra = [&](int s) { return GPTStage{s, count}.extra_parameters(c); };
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  std::vector<std::vector<std::int64_t>> best(count + 1, std::vector<std::int64_t>(n + 1, kNone));
  std::vector<std::vector<std::int64_t>> cut(count + 1, std::vector<std::int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= count; ++s)
    for (std::int64_t k = s; k <= n; ++k)
      for (std::int64_t j = s - 1; j < k; ++j) {  // stage s-1 holds blocks [j, k)
        if (best[s - 1][j] == kNone) continue;
        const std::int64_t worst = std::max(best[s - 1][j], (k - j) * block + extra(s - 1));
        if (worst < best[s][k]) best[s][k] = worst, cut[s][k] = j;
      }
  std::int64_t end = n;
  for (int s = count; s > index + 1; --s) end = cut[s][end];
  return {cut[index + 1][end], end};
}

GPT::GPT(const GPTConfig& config, DType dtype, GPTStage stage, TensorShard tensor)
    : config_(config), stage_(stage), tensor_(std::move(tensor)) {
  config_.validate();
  const auto& c = config_;
  MT_CHECK(tensor_.count >= 1 && tensor_.rank >= 0 && tensor_.rank < tensor_.count, "GPT",
           "tensor-parallel rank {} of {}: the rank must be in [0, count)", tensor_.rank, tensor_.count);
  if (tensor_.split()) {
    MT_CHECK(tensor_.group != nullptr && tensor_.group->size() == tensor_.count &&
                 tensor_.group->rank() == tensor_.rank,
             "GPT", "tensor-parallel rank {} of {} needs its group (got {})", tensor_.rank, tensor_.count,
             tensor_.group ? fmt::format("rank {} of {}", tensor_.group->rank(), tensor_.group->size())
                           : std::string("none"));
    MT_CHECK(c.n_head % tensor_.count == 0, "GPT", "n_head {} is not a multiple of the {} tensor-parallel ranks",
             c.n_head, tensor_.count);
    MT_CHECK(c.vocab_size >= tensor_.count, "GPT", "a vocabulary of {} over {} tensor-parallel ranks", c.vocab_size,
             tensor_.count);
    MT_CHECK(stage.count == 1, "GPT", "tensor parallelism ({} ranks) inside a pipeline stage ({} stages): not yet",
             tensor_.count, stage.count);
  }
  vocab_rows_ = tensor_.split() ? tensor_.rows_part(c.vocab_size) : Range{0, c.vocab_size};
  MT_CHECK(stage.count >= 1 && stage.index >= 0 && stage.index < stage.count, "GPT",
           "pipeline stage {} of {}: the index must be in [0, count)", stage.index, stage.count);
  MT_CHECK(stage.count <= c.n_layer, "GPT", "{} pipeline stages for {} blocks: every stage needs a block",
           stage.count, c.n_layer);
  const auto [begin, end] = stage.blocks(c);
  // A part this stage does not hold is made on meta and dropped: its init still draws from the default stream,
  // so the parts that are held get the whole model's values.
  const auto make = [&](bool held, auto build) {
    if (held) return build();
    ParameterDeviceGuard on_meta(Device::meta());
    build();
    return decltype(build())();
  };
  const bool whole = stage.count == 1;
  wte_ = make(stage.first() || stage.last(), [&] {
    return tensor_.split() ? make_embedding_part(c.vocab_size, c.n_embd, dtype, vocab_rows_)
                           : std::make_shared<Embedding>(c.vocab_size, c.n_embd, dtype);
  });
  if (wte_) {
    register_module("wte", wte_);
    if (!whole && !stage.last()) Tensor(wte_->weight()).set_requires_grad(false);  // the first stage's copy
  }
  wpe_ = make(stage.first(), [&] { return std::make_shared<Embedding>(c.block_size, c.n_embd, dtype); });
  if (wpe_) register_module("wpe", wpe_);
  drop_ = register_module("drop", std::make_shared<Dropout>(c.dropout));
  // Blocks register as "h.0", "h.1", ... directly, which yields HF's dotted names without a list module.
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    auto block = make(i >= begin && i < end, [&] {
      return std::make_shared<TransformerBlock>(c.n_embd, c.n_head, c.n_layer, c.bias, c.dropout, dtype, tensor_);
    });
    if (block) h_.push_back(register_module(fmt::format("h.{}", i), block));
  }
  ln_f_ = make(stage.last(), [&] { return std::make_shared<LayerNorm>(c.n_embd, c.bias, 1e-5, dtype); });
  if (ln_f_) register_module("ln_f", ln_f_);
  if (tensor_.split()) {
    // The parts are the parameters whose shape is not the whole model's (on meta: no memory, the stream kept).
    RngStateGuard stream;
    ParameterDeviceGuard on_meta(Device::meta());
    std::map<std::string, Shape> whole;
    for (const auto& [name, t] : GPT(config_, dtype, stage_).named_parameters()) whole[name] = t.shape();
    for (const auto& [name, t] : named_parameters())
      if (t.shape() != whole.at(name)) split_names_.insert(name);
  }
}

bool GPT::split_by_tensor_parallel(const std::string& name) const { return split_names_.count(name) > 0; }

Tensor GPT::embed(const Tensor& tokens) const {
  const std::int64_t T = tokens.size(1);
  Tensor pos = arange(0.0, static_cast<double>(T), 1.0, DType::i64);  // (T)
  pos = pos.to(tokens.device());                                      // beside the token rows
  return drop_->forward(tokens + wpe_->forward(pos));                 // (B,T,C)
}

Tensor GPT::lookup(const Tensor& idx) const {
  if (!tensor_.split()) return wte_->forward(idx);
  return vocab_parallel_embedding(wte_->weight(), idx, vocab_rows_.first, config_.vocab_size, *tensor_.group);
}

Tensor GPT::run_blocks(Tensor x) const {
  const auto n = static_cast<std::int64_t>(h_.size());
  for (std::int64_t i = 0; i < n; ++i) {
    x = run_block(i, n, [block = h_[i].get()](const Tensor& in) { return block->forward(in); }, x);
  }
  return x;
}

Tensor GPT::hidden(const Tensor& idx) const {
  MT_CHECK(stage_.count == 1, "GPT::forward", "stage {} of {} holds part of the model: use forward_stage",
           stage_.index, stage_.count);
  MT_CHECK(idx.dim() == 2, "GPT::forward", "expected idx [B, T], got {}", shape_str(idx.shape()));
  const std::int64_t T = idx.size(1);
  MT_CHECK(T >= 1 && T <= config_.block_size, "GPT::forward", "sequence length {} outside [1, block_size {}]", T,
           config_.block_size);
  return ln_f_->forward(run_blocks(embed(lookup(idx))));
}

Tensor GPT::forward(const Tensor& idx) const {
  MT_CHECK(!tensor_.split(), "GPT::forward",
           "rank {} of {} tensor-parallel ranks holds {} of the {} logits of each token: they are never gathered "
           "(use loss)", tensor_.rank, tensor_.count, vocab_rows_.second - vocab_rows_.first, config_.vocab_size);
  const Tensor h = hidden(idx);                  // (B,T,C)
  return ops::matmul(h, wte_->weight().t());  // (B,T,V), tied head
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) const {
  MT_CHECK(targets.shape() == idx.shape(), "GPT::loss", "targets {} must match idx {}", shape_str(targets.shape()),
           shape_str(idx.shape()));
  return head_loss(hidden(idx), targets);
}

Tensor GPT::head_loss(const Tensor& h, const Tensor& targets) const {
  const std::int64_t N = targets.numel();
  const Tensor& head = wte_->weight();
  if (tensor_.split()) {
    const Tensor x = tensor_parallel_copy(h.reshape({N, config_.n_embd}), *tensor_.group);
    return vocab_parallel_cross_entropy(x, head, vocab_rows_.first, config_.vocab_size, targets.reshape({N}),
                                        *tensor_.group, -100, ops::fused_head_chunk_rows(head.size(0)));
  }
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

GPT::StageOutput GPT::forward_stage(const Tensor& idx, const Tensor& input, const Tensor& targets) const {
  const char* op = "GPT::forward_stage";
  MT_CHECK(idx.dim() == 2 && idx.size(1) >= 1 && idx.size(1) <= config_.block_size, op,
           "expected idx [B, T] with T in [1, block_size {}], got {}", config_.block_size, shape_str(idx.shape()));
  StageOutput out;
  Tensor x;
  if (stage_.first()) {
    Tensor tokens = lookup(idx);
    if (stage_.count > 1) {
      // The copy is frozen: the lookup's gradient is taken here and scattered into wte's on the last stage.
      tokens = tokens.detach();
      tokens.set_requires_grad(true);
      out.token_rows = tokens;
    }
    x = embed(tokens);
  } else {
    const Shape expected{idx.size(0), idx.size(1), config_.n_embd};
    MT_CHECK(input.defined() && input.shape() == expected, op, "stage {} of {} expects the previous stage's {}, got {}",
             stage_.index, stage_.count, shape_str(expected),
             input.defined() ? shape_str(input.shape()) : std::string("nothing"));
    x = input;
  }
  x = run_blocks(x);
  if (!stage_.last()) {
    out.output = x;
    return out;
  }
  MT_CHECK(targets.shape() == idx.shape(), op, "targets {} must match idx {}", shape_str(targets.shape()),
           shape_str(idx.shape()));
  out.output = head_loss(ln_f_->forward(x), targets);
  return out;
}

}  // namespace memtrain::nn
