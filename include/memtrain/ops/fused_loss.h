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
// time. Weight f32, or stored in x's bf16/f16 dtype (no f32 master: its GEMMs then read it as it is, and its dW,
// in its dtype, is summed in f32 a block of rows at a time and rounded once per chunk); bias f32; x f32, bf16 or
// f16; the loss is f32 and dx comes back in x's dtype.
//
// The GEMMs run in f32 (narrow rows widened chunk by chunk), or, under a HeadGemmsInComputeDtype guard and
// autocast (a CastMode that casts the weight to x's bf16/f16 dtype) where the backend multiplies that dtype
// natively (Backend::gemm_narrow_native), in x's dtype with f32 accumulation: logits and the loss stay f32,
// dlogits are rounded to x's dtype for the dx and dW products, and dW is summed in f32. An f32 weight is cast a
// block of 4096 rows at a time into a workspace buffer just before each block's product, so no whole narrow copy
// of it is ever made.
//
// The gradients: with a mean or sum reduction, under a LossGradientSeed guard (below) and when x, weight or
// bias needs a gradient, they are computed during the forward, chunk by chunk from each chunk's logits, and
// kept (dx like x, dW and db f32) until the backward hands them on. Otherwise (no guard, reduction none, or a
// backward whose gradient is not the declared seed) the backward recomputes each chunk's logits from x, the
// weight and the saved per-row log-sum-exp ([N] floats). Both give the same bits.
Tensor fused_linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                  Reduction reduction = Reduction::mean, std::int64_t ignore_index = -100,
                                  std::int64_t chunk_rows = 1024);

// Declares, for the life of the guard on this thread, the gradient the caller will seed the backward of its
// loss with: train::Trainer's micro-batch weight times the loss scale, 1 for a plain loss.backward(). When the
// loss is the last op, the upstream gradient of a mean or sum is then known before the backward, and
// fused_linear_cross_entropy computes its gradients in its forward (as Liger Kernel's fused linear
// cross-entropy and Apple's Cut Cross-Entropy do), saving the backward's recompute of every logit: a third of
// gpt2-124M's step FLOPs on the CPU. A loss that feeds another op (scaled, or one term of several) reaches the
// head's backward with another gradient; the head then falls back to the recompute, at the cost of the work
// its forward did. Guards nest; the innermost one counts.
class LossGradientSeed {
 public:
  explicit LossGradientSeed(double seed);
  ~LossGradientSeed();
  LossGradientSeed(const LossGradientSeed&) = delete;
  LossGradientSeed& operator=(const LossGradientSeed&) = delete;

 private:
  double previous_;
  bool had_previous_;
};

// While alive on this thread, fused_linear_cross_entropy under autocast runs its GEMMs in the compute dtype
// (above): about twice as fast on a CPU with bf16 instructions. It costs workspace at the head, a step's peak
// moment: the chunk's dlogits in the compute dtype (half the f32 logits chunk) and one cast block of the weight
// (4096 x C), against the f32 GEMMs' widened rows. Without the guard the head keeps f32 GEMMs.
// train::TrainerConfig::head_gemms_in_compute_dtype installs it.
class HeadGemmsInComputeDtype {
 public:
  HeadGemmsInComputeDtype();
  ~HeadGemmsInComputeDtype();
  HeadGemmsInComputeDtype(const HeadGemmsInComputeDtype&) = delete;
  HeadGemmsInComputeDtype& operator=(const HeadGemmsInComputeDtype&) = delete;

 private:
  bool previous_;
};

// How many fused_linear_cross_entropy backwards on this thread recomputed their logits (no seed, reduction
// none, or the fallback), since the thread started: the path a test can see.
std::int64_t fused_head_recomputes();

// The chunk_rows whose f32 logits take at most `budget_bytes` for a vocabulary of `vocab` (at least 16 rows, so
// each chunk's GEMM stays large). gpt2's 50257 tokens with the default 32 MiB: 166 rows, where 1024 rows held
// 196 MiB, more than any other workspace of a gpt2-124M step.
std::int64_t fused_head_chunk_rows(std::int64_t vocab, std::size_t budget_bytes = std::size_t{32} << 20);

}  // namespace memtrain::ops
