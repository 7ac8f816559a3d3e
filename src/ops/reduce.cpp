// Reductions: sum, mean, max, argmax, and sum_to (broadcast backward).
#include "memtrain/ops/reduce.h"

#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "core/backend.h"
#include "memtrain/ops/elementwise.h"
#include "ops/op_utils.h"

#include <algorithm>

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;

namespace {

// wrap_dim whose message also names the input's shape.
std::int64_t checked_dim(const char* op, std::int64_t dim, const Tensor& a) {
  const std::int64_t r = std::max<std::int64_t>(a.dim(), 1);
  MT_CHECK(dim >= -r && dim < r, op, "dimension {} out of range for input {} of rank {}", dim, shape_str(a.shape()),
           a.dim());
  return dim < 0 ? dim + r : dim;
}

// Normalised, sorted, unique reduction dims; empty input means all dims.
std::vector<bool> reduced_mask(const char* op, const Tensor& a, const Shape& dims) {
  std::vector<bool> mask(static_cast<std::size_t>(a.dim()), dims.empty());
  for (auto d : dims) {
    const std::int64_t w = checked_dim(op, d, a);
    if (a.dim() == 0) continue;  // a scalar reduces over its (implicit) dim 0 to itself
    MT_CHECK(!mask[w], op, "dimension {} repeated in {} (input {})", d, shape_str(dims), shape_str(a.shape()));
    mask[w] = true;
  }
  return mask;
}

Shape keepdim_shape(const Tensor& a, const std::vector<bool>& mask) {
  Shape s = a.shape();
  for (std::size_t i = 0; i < s.size(); ++i)
    if (mask[i]) s[i] = 1;
  return s;
}

Shape drop_reduced(const Shape& keep, const std::vector<bool>& mask) {
  Shape s;
  for (std::size_t i = 0; i < keep.size(); ++i)
    if (!mask[i]) s.push_back(keep[i]);
  return s;
}

// Values (a's dtype; undefined unless wanted) and i64 positions of the first maximum along dim d, both
// shaped like `a` with dim d set to 1. NaN counts as larger than any number, so a NaN in a row propagates
// (as in PyTorch).
struct MaxResult {
  Tensor values;
  Tensor indices;
};

MaxResult max_kernel(const char* op, const Tensor& a, std::int64_t d, bool want_values = true) {
  const std::int64_t n = a.shape()[d];
  MT_CHECK(n > 0, op, "cannot reduce over dimension {} of size 0 (input {})", d, shape_str(a.shape()));
  Shape keep = a.shape();
  keep[d] = 1;
  MaxResult r{want_values ? Tensor::empty(keep, a.dtype(), a.device()) : Tensor(),
              Tensor::empty(keep, DType::i64, a.device())};
  ::memtrain::detail::backend_for(a.device()).max(r.values, r.indices, a, d);
  return r;
}

}  // namespace

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim) {
  detail::check_floating("sum", a);
  const std::vector<bool> mask = reduced_mask("sum", a, dims);
  const Shape keep = keepdim_shape(a, mask);
  Tensor out = Tensor::empty(keep, a.dtype(), a.device());
  ::memtrain::detail::backend_for(a.device()).sum(out, a.detach());
  if (!keepdim) out = out.view(drop_reduced(keep, mask));
  if (needs_grad({&a})) {
    record("sum", {a}, {out}, [keep, in_shape = a.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].reshape(keep).expand(in_shape)};
    });
  }
  return out;
}

Tensor sum(const Tensor& a) { return sum(a, {}, false); }

Tensor mean(const Tensor& a, const Shape& dims, bool keepdim) {
  const std::vector<bool> mask = reduced_mask("mean", a, dims);
  std::int64_t count = 1;
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) count *= a.shape()[i];
  return div(sum(a, dims, keepdim), static_cast<double>(count));  // 0 / 0 = NaN over no elements, as in PyTorch
}

Tensor mean(const Tensor& a) { return mean(a, {}, false); }

Tensor max(const Tensor& a, std::int64_t dim, bool keepdim) {
  detail::check_floating("max", a);
  const std::int64_t d = checked_dim("max", dim, a);
  if (a.dim() == 0) return max(a.reshape({1}), 0, false);
  MaxResult r = max_kernel("max", a.detach(), d);  // detached: the conversion to f32 needs no node
  Tensor out = keepdim ? r.values : r.values.squeeze(d);
  if (needs_grad({&a})) {
    // The gradient lands on the saved position: a one-hot mask from comparing the index with
    // 0..n-1 along dim d, then where(). Written with ops only, so it runs wherever they do.
    record("max", {a}, {out},
           [si = autograd::SavedTensor(r.indices), in_shape = a.shape(), d, keepdim](const std::vector<Tensor>& g) {
             const Tensor gk = keepdim ? g[0] : g[0].unsqueeze(d);
             const Tensor idx = si.unpack();
             Shape along(in_shape.size(), 1);
             along[d] = in_shape[d];
             const Tensor positions = arange(static_cast<double>(in_shape[d]), DType::i64).view(along).to(idx.device());
             const Tensor onehot = eq(idx, positions);
             return std::vector<Tensor>{where(onehot, gk, zeros({}, gk.dtype(), gk.device()))};
           });
  }
  return out;
}

Tensor argmax(const Tensor& a, std::int64_t dim, bool keepdim) {
  detail::check_defined("argmax", a);
  MT_CHECK(is_floating(a.dtype()), "argmax", "needs a floating tensor, got {} {}", shape_str(a.shape()),
           dtype_name(a.dtype()));
  const std::int64_t d = checked_dim("argmax", dim, a);
  if (a.dim() == 0) return zeros({}, DType::i64, a.device());
  Tensor idx = max_kernel("argmax", a.detach(), d, /*want_values=*/false).indices;
  return keepdim ? idx : idx.squeeze(d);
}

Tensor sum_to(const Tensor& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  MT_CHECK(static_cast<std::int64_t>(shape.size()) <= a.dim(), "sum_to", "cannot sum {} to the larger rank {}",
           shape_str(a.shape()), shape_str(shape));
  const std::size_t lead = static_cast<std::size_t>(a.dim()) - shape.size();
  Shape dims;
  for (std::size_t i = 0; i < static_cast<std::size_t>(a.dim()); ++i) {
    if (i < lead) {
      dims.push_back(static_cast<std::int64_t>(i));
    } else if (shape[i - lead] == 1 && a.shape()[i] != 1) {
      dims.push_back(static_cast<std::int64_t>(i));
    } else {
      MT_CHECK(shape[i - lead] == a.shape()[i], "sum_to", "shape {} is not a broadcast of {}", shape_str(a.shape()),
               shape_str(shape));
    }
  }
  if (dims.empty()) return a.reshape(shape);
  return sum(a, dims, true).reshape(shape);
}

}  // namespace memtrain::ops
