// Joining and splitting tensors (the views themselves are Tensor methods).
#pragma once

#include "memtrain/core/tensor.h"

#include <vector>

namespace memtrain::ops {

Tensor concat(const std::vector<Tensor>& tensors, std::int64_t dim);
// Views of consecutive pieces of `sizes` along dim (sizes must add up to the dim's size).
std::vector<Tensor> split(const Tensor& a, const Shape& sizes, std::int64_t dim);
std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, std::int64_t dim);

// x [..., n, ...] (n at dim), indices i32 or i64 [k] -> [..., k, ...]: out's slice j along dim is x's slice
// indices[j], as PyTorch's index_select. Here with concat and split, not in nn.h, since it moves slices
// along a dim as they do (it computes nothing). An index outside [0, n) throws naming it and its position.
// Differentiable for floating x: the gradient is scattered back, and repeated indices accumulate. Keeps
// x's dtype under autocast. Integer and bool x are copied slice by slice (for dataset code).
Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& indices);

}  // namespace memtrain::ops
