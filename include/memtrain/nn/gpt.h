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
#include "memtrain/nn/tensor_shard.h"
#include "memtrain/nn/transformer_block.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace memtrain::nn {

// One stage of a pipeline (TrainerConfig::pipeline_stages): the part of the model one process builds and runs.
// Stage `index` of `count` holds blocks blocks(config) of the model: contiguous runs, at least one block each,
// balanced by the parameters each stage trains (a split whose largest stage is the smallest possible). The first
// stage holds wte and wpe, the last ln_f and the head. The head is tied to wte: the last stage trains wte; the
// first keeps a copy with requires_grad false for its lookups, which the pipeline refreshes after every step
// (train/pipeline.h).
struct GPTStage {
  int index = 0;
  int count = 1;
  bool first() const { return index == 0; }
  bool last() const { return index + 1 == count; }
  // [begin, end) of the model's n_layer blocks.
  std::pair<std::int64_t, std::int64_t> blocks(const GPTConfig& config) const;
  // The parameters each block trains, and the stage's extra ones (the first: wpe; the last: wte and ln_f).
  static std::int64_t block_parameters(const GPTConfig& config);
  std::int64_t extra_parameters(const GPTConfig& config) const;
};

// Checkpointable blocks (BlockCheckpointedModule): the transformer blocks, one region each.
class GPT : public BlockCheckpointedModule {
 public:
  // With a stage of count > 1, only that stage's parameters are made (same names and values as the whole
  // model's: the other parts are made on the meta device, so the default RNG stream advances as for the whole
  // model). Refused when the stage has no block (count > n_layer) or its index is outside [0, count).
  // With a tensor shard of count T > 1 (tensor parallelism, nn/tensor_shard.h), every block holds its rank's
  // heads and MLP units and wte holds rows tensor.rows_part(vocab_size), with the same names and the whole
  // model's values; the embedding lookup and the loss are vocabulary-parallel (nn/tensor_parallel_ops.h), so no
  // rank holds the whole wte or any whole logits. Refused: n_head not a multiple of T, a vocabulary smaller than
  // T, and a pipeline stage beside it (not yet).
  explicit GPT(const GPTConfig& config, DType dtype = DType::f32, GPTStage stage = {}, TensorShard tensor = {});
  // idx [B, T] integer, T <= block_size -> logits [B, T, V]. Refused under tensor parallelism (the logits are
  // never gathered there).
  Tensor forward(const Tensor& idx) const;
  // Mean cross entropy of forward(idx) against targets [B, T]; targets equal to -100 are ignored. With an f32
  // head (x f32, bf16 or f16, on the CPU and on CUDA) the head and the loss are fused
  // (ops::fused_linear_cross_entropy): the [B*T, V] logits never exist, forward or backward; otherwise the
  // logits are formed and ops::cross_entropy is applied.
  Tensor loss(const Tensor& idx, const Tensor& targets) const;
  const GPTConfig& config() const { return config_; }
  const GPTStage& stage() const { return stage_; }
  const TensorShard& tensor_shard() const { return tensor_; }
  // Whether this rank holds only a part of the parameter of that name (tensor parallelism: its shape is not the
  // whole model's); the others are held whole by every rank.
  bool split_by_tensor_parallel(const std::string& name) const;

  // What one stage's part of the forward made for one micro-batch.
  struct StageOutput {
    // The last stage's mean loss against targets (as loss()); elsewhere the hidden states [B, T, C] that the next
    // stage takes as `input`.
    Tensor output;
    // First stage of several: the rows looked up in its wte copy, a leaf whose gradient the last stage scatters
    // into wte's (ops::embedding_scatter_add_); undefined elsewhere.
    Tensor token_rows;
  };
  // This stage's part of loss(idx, targets): the first stage starts from idx, the others from `input` (the
  // previous stage's output, which should require grad so that its gradient can be sent back).
  StageOutput forward_stage(const Tensor& idx, const Tensor& input, const Tensor& targets) const;

 private:
  GPTConfig config_;
  GPTStage stage_;
  TensorShard tensor_;
  Range vocab_rows_;  // the rows of wte this rank holds: all of them unless the vocabulary is split
  std::set<std::string> split_names_;  // the parameters this rank holds a part of
  std::shared_ptr<Embedding> wte_;
  std::shared_ptr<Embedding> wpe_;
  std::shared_ptr<Dropout> drop_;
  std::vector<std::shared_ptr<TransformerBlock>> h_;
  std::shared_ptr<LayerNorm> ln_f_;
  Tensor hidden(const Tensor& idx) const;  // ln_f output (B,T,C)
  Tensor embed(const Tensor& tokens) const;  // drop(tokens + wpe[positions]): tokens [B, T, C] from wte
  Tensor lookup(const Tensor& idx) const;    // wte[idx], vocabulary-parallel when split
  Tensor run_blocks(Tensor x) const;         // this stage's blocks
  Tensor head_loss(const Tensor& h, const Tensor& targets) const;  // ln_f'd h against targets, mean
};

}  // namespace memtrain::nn
