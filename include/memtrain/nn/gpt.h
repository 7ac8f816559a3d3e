// GPT: the GPT-2 architecture. logits = ln_f(h_{L-1}(...h_0(drop(wte[idx] + wpe[pos])))) @ wte^T, the head
// tied to the token embedding (one parameter, "wte.weight", counted once).
//
// Parameter names are Hugging Face GPT-2's without the "transformer." prefix:
//   wte.weight, wpe.weight, h.{i}.ln_1.{weight,bias}, h.{i}.attn.c_attn.{weight,bias},
//   h.{i}.attn.c_proj.{weight,bias}, h.{i}.ln_2.{weight,bias}, h.{i}.mlp.c_fc.{weight,bias},
//   h.{i}.mlp.c_proj.{weight,bias}, ln_f.{weight,bias}
// Linear weights are [out, in]; HF stores its Conv1D weights [in, out], so a loader transposes those four.
// Init as GPT-2: weights normal(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) normal(0,
// 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1; drawn from the default RNG stream (manual_seed).
#pragma once

#include "memtrain/nn/block_checkpointed_module.h"
#include "memtrain/nn/dropout.h"
#include "memtrain/nn/embedding.h"
#include "memtrain/nn/gpt_config.h"
#include "memtrain/nn/layer_norm.h"
#include "memtrain/nn/transformer_block.h"

#include <memory>
#include <vector>

namespace memtrain::nn {

// Checkpointable blocks (BlockCheckpointedModule): the transformer blocks, one region each.
class GPT : public BlockCheckpointedModule {
 public:
  explicit GPT(const GPTConfig& config, DType dtype = DType::f32);
  // idx [B, T] integer, T <= block_size -> logits [B, T, V].
  Tensor forward(const Tensor& idx) const;
  // Mean cross entropy of forward(idx) against targets [B, T]; targets equal to -100 are ignored. With an f32
  // head (x f32, bf16 or f16, on the CPU and on CUDA) the head and the loss are fused
  // (ops::fused_linear_cross_entropy): the [B*T, V] logits never exist, forward or backward; otherwise the
  // logits are formed and ops::cross_entropy is applied.
  Tensor loss(const Tensor& idx, const Tensor& targets) const;
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
  std::shared_ptr<Embedding> wte_;
  std::shared_ptr<Embedding> wpe_;
  std::shared_ptr<Dropout> drop_;
  std::vector<std::shared_ptr<TransformerBlock>> h_;
  std::shared_ptr<LayerNorm> ln_f_;
  Tensor hidden(const Tensor& idx) const;  // ln_f output (B,T,C)
};

}  // namespace memtrain::nn
