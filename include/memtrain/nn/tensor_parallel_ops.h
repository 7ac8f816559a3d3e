// Tensor parallelism (Megatron-LM): one layer's weight split over the ranks of a group, each rank computing its
// part and the group summing the parts. The four autograd ops below are what nn::GPT's layers call when built
// with an nn::TensorShard of count > 1 (nn/tensor_shard.h says which part each rank holds).
//
// Every sum is TensorParallelGroup::all_reduce_sum: the same bits on every rank (over MPI, the canonical
// all-reduce), so the parameters that every rank holds whole (layer norms, wpe, the row-parallel biases) receive
// identical gradients and stay identical without being synchronised. Tensors live on the CPU (the MPI backend).
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/nn/tensor_shard.h"

#include <cstdint>

namespace memtrain::nn {

// Megatron's f: x itself in the forward; the gradient summed over the group in the backward. What a
// column-parallel layer's input passes through: every rank's part of the layer contributes to dx.
Tensor tensor_parallel_copy(const Tensor& x, TensorParallelGroup& group);
// Megatron's g: x summed over the group in the forward; the gradient as it is in the backward. What a
// row-parallel layer's partial output passes through.
Tensor tensor_parallel_sum(const Tensor& x, TensorParallelGroup& group);

// A vocabulary-parallel embedding: `rows` [R, C] are rows [first_row, first_row + R) of the whole [vocab, C]
// table, idx any integer shape (every index in [0, vocab), checked). Each rank looks up the indices that fall in
// its rows (zero elsewhere) and the group sums: the result is the whole table's lookup [..., C] on every rank,
// and each rank's gradient reaches its own rows only.
Tensor vocab_parallel_embedding(const Tensor& rows, const Tensor& idx, std::int64_t first_row, std::int64_t vocab,
                                TensorParallelGroup& group);

// A vocabulary-parallel fused linear + cross-entropy: x [N, C] (f32, bf16 or f16; the same on every rank),
// `rows` [R, C] rows [first_row, first_row + R) of the [vocab, C] head weight, targets [N] (i32 or i64, the same
// on every rank; ignore_index skips a row). Returns the mean loss over the rows not ignored, the same on every
// rank, as cross_entropy(x @ W^T, targets) up to rounding. Each rank forms logits only for its R columns, one
// chunk of chunk_rows rows at a time, so neither the whole head weight nor any [N, vocab] logits exist on a
// rank: per chunk the ranks exchange each row's log-sum-exp over their columns and their part of the target's
// logit (one all_gather of 2 floats per row). The backward recomputes each chunk's logits from x, the rows and
// the saved [N] log-sum-exps; its dx is this rank's part, which the tensor_parallel_copy that x came through
// sums over the group. GEMMs and the loss in f32 (rows stored narrower are widened whole, once per pass).
Tensor vocab_parallel_cross_entropy(const Tensor& x, const Tensor& rows, std::int64_t first_row, std::int64_t vocab,
                                    const Tensor& targets, TensorParallelGroup& group,
                                    std::int64_t ignore_index = -100, std::int64_t chunk_rows = 256);

}  // namespace memtrain::nn
