// Reductions over dimensions. Negative dims count from the end; an empty dims list means all dims.
#pragma once

#include "memtrain/core/tensor.h"

namespace memtrain::ops {

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor sum(const Tensor& a);  // all elements -> shape []
Tensor mean(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor mean(const Tensor& a);
// Max over one dim; the gradient goes to the first maximal element.
Tensor max(const Tensor& a, std::int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, std::int64_t dim, bool keepdim = false);  // i64, not differentiable

// Sums a broadcast gradient back to `shape` (the inverse of expand); used by broadcasting backward rules.
Tensor sum_to(const Tensor& a, const Shape& shape);

}  // namespace memtrain::ops
