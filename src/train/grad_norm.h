// Sum of squares over a list of tensors (gradients), on whatever devices they live: the one reduction
// global_grad_norm and the layer-wise updater share.
#pragma once

#include "memtrain/core/tensor.h"

#include <vector>

namespace memtrain::train::detail {

// sum_i sum_j t_i[j]^2 in double; undefined tensors count as zero. CPU tensors are read in place (f32/f64,
// contiguous) or through an f32 copy; CUDA tensors are reduced on their device; meta tensors count as zero
// (see grad_clip.cpp).
double sum_of_squares(const std::vector<Tensor>& tensors);

}  // namespace memtrain::train::detail
