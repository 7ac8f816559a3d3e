#include "ops/op_utils.h"

#include <algorithm>

namespace memtrain::ops::detail {

void check_defined(const char* op, const Tensor& a) { MT_CHECK(a.defined(), op, "undefined tensor argument"); }

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, a);
  check_defined(op, b);
  MT_CHECK(a.dtype() == b.dtype(), op, "dtype mismatch: {} {} vs {} {}", shape_str(a.shape()), dtype_name(a.dtype()),
           shape_str(b.shape()), dtype_name(b.dtype()));
  MT_CHECK(a.device() == b.device(), op, "device mismatch: {} on {} vs {} on {}", shape_str(a.shape()),
           a.device().str(), shape_str(b.shape()), b.device().str());
}

void check_floating(const char* op, const Tensor& a) {
  check_defined(op, a);
  MT_CHECK(is_floating(a.dtype()), op, "needs a floating tensor, got {} {}", shape_str(a.shape()),
           dtype_name(a.dtype()));
}

std::int64_t wrap_dim(const char* op, std::int64_t dim, std::int64_t rank) {
  const std::int64_t r = std::max<std::int64_t>(rank, 1);
  MT_CHECK(dim >= -r && dim < r, op, "dimension {} out of range for rank {}", dim, rank);
  return dim < 0 ? dim + r : dim;
}

std::int64_t wrap_dim(const char* op, std::int64_t dim, const Shape& shape) {
  const auto rank = static_cast<std::int64_t>(shape.size());
  const std::int64_t r = std::max<std::int64_t>(rank, 1);
  MT_CHECK(dim >= -r && dim < r, op, "dimension {} out of range for a tensor of shape {}", dim, shape_str(shape));
  return dim < 0 ? dim + r : dim;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MT_CHECK(da == db || da == 1 || db == 1, op, "shapes {} and {} cannot be broadcast together", shape_str(a),
             shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const std::size_t n = shape.size(), r = static_cast<std::size_t>(t.dim());
  Shape strides(n, 0);
  for (std::size_t i = 0; i < r; ++i) {
    const std::size_t j = n - r + i;
    strides[j] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return strides;
}

Tensor to_compute(const Tensor& t) {
  const DType c = compute_dtype(t.dtype());
  const Tensor data = t.detach();  // kernel inputs are never recorded: the op records its own node
  return data.dtype() == c ? data : data.to(c);
}

}  // namespace memtrain::ops::detail
