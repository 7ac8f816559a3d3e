// Joining and splitting tensors (the views themselves are Tensor methods).
#pragma once

#include "memtrain/core/tensor.h"

#include <vector>

namespace memtrain::ops {

Tensor concat(const std::vector<Tensor>& tensors, std::int64_t dim);
// Views of consecutive pieces of `sizes` along dim (sizes must add up to the dim's size).
std::vector<Tensor> split(const Tensor& a, const Shape& sizes, std::int64_t dim);
std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, std::int64_t dim);

}  // namespace memtrain::ops
