// Fused loss heads: a linear projection and its loss computed together so the [N, V] logits never exist
// at once (llm.c's fused classifier, Liger-Kernel's fused linear cross-entropy).
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/ops/nn.h"

#include <cstdint>

namespace memtrain::ops {

// x [N, C], weight [V, C], bias [V] or undefined, targets i32/i64 [N] -> scalar (mean/sum) or [N] (none).
// Equals cross_entropy(linear(x, weight, bias), targets, reduction, ignore_index) up to rounding. Walks the
// rows in chunks of chunk_rows: only one chunk of logits (chunk_rows x V floats, workspace) is alive at a
// time, forward and backward; the backward recomputes each chunk from x, weight, bias and the saved
// per-row log-sum-exp ([N] floats). Weight and bias f32; x f32, or bf16/f16 on the CPU, bf16 on CUDA (mixed
// precision: rows are widened chunk by chunk, the loss is f32 and dx comes back in x's dtype). On CUDA the
// chunk GEMMs are cuda::gemm in f32 and the loss the CUDA cross-entropy kernels.
Tensor fused_linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                  Reduction reduction = Reduction::mean, std::int64_t ignore_index = -100,
                                  std::int64_t chunk_rows = 1024);

// The chunk_rows whose f32 logits take at most `budget_bytes` for a vocabulary of `vocab` (at least 16 rows, so
// each chunk's GEMM stays large). gpt2's 50257 tokens with the default 32 MiB: 166 rows, where 1024 rows held
// 196 MiB, more than any other workspace of a gpt2-124M step.
std::int64_t fused_head_chunk_rows(std::int64_t vocab, std::size_t budget_bytes = std::size_t{32} << 20);

}  // namespace memtrain::ops
