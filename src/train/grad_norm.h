// Sum of squares over a list of tensors (gradients), on whatever devices they live: the one reduction
// global_grad_norm and the layer-wise updater share.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace memtrain::train::detail {

// sum_i sum_j t_i[j]^2 in double; undefined tensors count as zero. CPU tensors are read in place (f32/f64,
// contiguous) or through an f32 copy; CUDA tensors are reduced on their device; meta tensors count as zero
// (see grad_clip.cpp).
double sum_of_squares(const std::vector<Tensor>& tensors);

// out[b] (host memory) := the sum of squares of elements [256 b, 256 b + 256) of g (contiguous f32), in double:
// the unit every canonical norm is summed from, computed by g's backend (block_sums_of_squares; on meta nothing
// is written).
void block_squares(const Tensor& g, double* out);
// sqrt of block_squares' blocks summed in order: one tensor's canonical norm, whatever its split into shards
// (undefined: 0; meta: 0).
double canonical_norm(const Tensor& grad);

// A piece of one parameter's flattened gradient: the whole of it, or a ZeRO shard (first element a multiple of
// 256).
struct GradPiece {
  std::size_t param;   // index into the parameter list the numels describe
  std::int64_t begin;  // its first element
  Tensor grad;         // flat, contiguous f32, on any device (undefined: zero)
};

// The global L2 norm in one canonical order, whatever the split of the gradients over ranks: the sum of
// squares of each 256-element block of each parameter in double, element by element, then the blocks summed in
// (parameter, block) order. `numels` are the whole parameters' sizes; `pieces` cover them (whole gradients),
// or only this rank's shards, and then combine_disjoint (GradientSync) fills in the other ranks' blocks.
// Meta pieces (a prediction) add nothing.
double canonical_grad_norm(const std::vector<std::int64_t>& numels, const std::vector<GradPiece>& pieces,
                           const std::function<void(std::vector<double>&)>& combine_disjoint = nullptr);

}  // namespace memtrain::train::detail
