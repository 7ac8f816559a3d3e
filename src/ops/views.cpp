// Differentiable Tensor methods: views (sharing storage), contiguous, dtype/device moves and clone.
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/reduce.h"
#include "ops/op_utils.h"

#include <algorithm>
#include <numeric>
#include <optional>

namespace memtrain {

using autograd::needs_grad;
using autograd::record;
using ops::detail::wrap_dim;

namespace {

Tensor alias(const Tensor& t, Shape shape, Shape strides, std::int64_t offset) {
  return Tensor::make_view(t.storage(), std::move(shape), std::move(strides), offset, t.dtype());
}

// Replaces one -1 in `shape` by what makes numel match; checks the total.
Shape infer_shape(const char* op, Shape shape, std::int64_t numel) {
  std::int64_t known = 1;
  std::optional<std::size_t> infer;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MT_CHECK(!infer, op, "only one dimension can be -1 in {}", shape_str(shape));
      infer = i;
    } else {
      MT_CHECK(shape[i] >= 0, op, "invalid dimension {} in {}", shape[i], shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer) {
    MT_CHECK(known != 0 && numel % known == 0, op, "shape {} is invalid for {} elements", shape_str(shape), numel);
    shape[*infer] = numel / known;
  }
  MT_CHECK(shape_numel(shape) == numel, op, "shape {} is invalid for {} elements", shape_str(shape), numel);
  return shape;
}

// Strides that let `shape` view the same elements as (old_shape, old_strides), if any (as in PyTorch).
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  Shape strides(shape.size());
  if (shape_numel(old_shape) == 0 || old_shape.empty()) return contiguous_strides(shape);
  std::int64_t view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    // A chunk ends where the old dims stop being contiguous with each other.
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  const Shape shape = infer_shape("view", requested, numel());
  auto strides = view_strides(this->shape(), this->strides(), shape);
  MT_CHECK(strides.has_value(), "view",
           "cannot view a tensor of shape {} strides {} as {}: its layout is not compatible; use reshape()",
           shape_str(this->shape()), shape_str(this->strides()), shape_str(shape));
  Tensor out = alias(*this, shape, *strides, offset());
  if (needs_grad({this})) {
    record("view", {*this}, {out}, [in_shape = this->shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].reshape(in_shape)};
    });
  }
  return out;
}

Tensor Tensor::reshape(const Shape& requested) const {
  const Shape shape = infer_shape("reshape", requested, numel());
  if (view_strides(this->shape(), this->strides(), shape)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::flatten(std::int64_t start_dim, std::int64_t end_dim) const {
  const std::int64_t s = wrap_dim("flatten", start_dim, shape()), e = wrap_dim("flatten", end_dim, shape());
  if (dim() == 0) return reshape({1});
  MT_CHECK(s <= e, "flatten", "start_dim {} after end_dim {}", start_dim, end_dim);
  Shape shape(this->shape().begin(), this->shape().begin() + s);
  std::int64_t n = 1;
  for (std::int64_t i = s; i <= e; ++i) n *= this->shape()[i];
  shape.push_back(n);
  shape.insert(shape.end(), this->shape().begin() + e + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  const std::int64_t a = wrap_dim("transpose", d0, shape()), b = wrap_dim("transpose", d1, shape());
  Shape dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  if (dim() > 0) std::swap(dims[a], dims[b]);
  return permute(dims);
}

Tensor Tensor::permute(const Shape& dims) const {
  MT_CHECK(static_cast<std::int64_t>(dims.size()) == dim(), "permute", "{} dims given for a tensor of rank {}",
           dims.size(), dim());
  Shape shape(dims.size()), strides(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::int64_t d = wrap_dim("permute", dims[i], dim());
    MT_CHECK(!seen[d], "permute", "dimension {} repeated in {}", d, shape_str(dims));
    seen[d] = true;
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
    inverse[d] = static_cast<std::int64_t>(i);
  }
  Tensor out = alias(*this, shape, strides, offset());
  if (needs_grad({this})) {
    record("permute", {*this}, {out}, [inverse](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].permute(inverse)};
    });
  }
  return out;
}

Tensor Tensor::slice(std::int64_t dim_, std::int64_t start, std::int64_t end, std::int64_t step) const {
  const std::int64_t d = wrap_dim("slice", dim_, shape());
  MT_CHECK(dim() > 0, "slice", "cannot slice a scalar");
  MT_CHECK(step > 0, "slice", "step must be positive, got {}", step);
  const std::int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<std::int64_t>(start, 0, n);
  end = std::clamp<std::int64_t>(end, start, n);
  Shape shape = this->shape(), strides = this->strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor out = alias(*this, shape, strides, offset() + start * this->strides()[d]);
  if (needs_grad({this})) {
    record("slice", {*this}, {out}, [in_shape = this->shape(), d, start, end, step](const std::vector<Tensor>& g) {
      Tensor dx = zeros(in_shape, g[0].dtype(), g[0].device());
      dx.slice(d, start, end, step).copy_(g[0]);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor Tensor::narrow(std::int64_t dim_, std::int64_t start, std::int64_t length) const {
  const std::int64_t d = wrap_dim("narrow", dim_, shape());
  MT_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow",
           "range [{}, {}) outside dimension {} of size {} (shape {})", start, start + length, d, shape()[d],
           shape_str(shape()));
  return slice(d, start, start + length);
}

Tensor Tensor::select(std::int64_t dim_, std::int64_t index) const {
  const std::int64_t d = wrap_dim("select", dim_, shape());
  const std::int64_t n = shape()[d];
  MT_CHECK(index >= -n && index < n, "select", "index {} out of range for dimension {} of size {}", index, d, n);
  if (index < 0) index += n;
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape) const {
  MT_CHECK(static_cast<std::int64_t>(shape.size()) >= dim(), "expand", "cannot expand {} to fewer dims {}",
           shape_str(this->shape()), shape_str(shape));
  Shape out_shape(shape.size()), strides(shape.size(), 0);
  const std::size_t lead = shape.size() - static_cast<std::size_t>(dim());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      MT_CHECK(shape[i] >= 0, "expand", "invalid size {} in {}", shape[i], shape_str(shape));
      out_shape[i] = shape[i];
      continue;
    }
    const std::int64_t have = this->shape()[i - lead];
    const std::int64_t want = shape[i] == -1 ? have : shape[i];
    MT_CHECK(have == want || have == 1, "expand", "cannot expand {} to {}", shape_str(this->shape()),
             shape_str(shape));
    out_shape[i] = want;
    strides[i] = have == want ? this->strides()[i - lead] : 0;
  }
  Tensor out = alias(*this, out_shape, strides, offset());
  if (needs_grad({this})) {
    record("expand", {*this}, {out}, [in_shape = this->shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{ops::sum_to(g[0], in_shape)};
    });
  }
  return out;
}

Tensor Tensor::squeeze(std::int64_t dim_) const {
  const std::int64_t d = wrap_dim("squeeze", dim_, shape());
  if (dim() == 0 || shape()[d] != 1) return view(shape());
  Shape shape = this->shape();
  shape.erase(shape.begin() + d);
  return view(shape);
}

Tensor Tensor::squeeze() const {
  Shape shape;
  for (auto s : this->shape())
    if (s != 1) shape.push_back(s);
  return view(shape);
}

Tensor Tensor::unsqueeze(std::int64_t dim_) const {
  const std::int64_t d = wrap_dim("unsqueeze", dim_, dim() + 1);
  Shape shape = this->shape();
  shape.insert(shape.begin() + d, 1);
  return view(shape);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), dtype(), device());
  out.copy_(*this);
  if (needs_grad({this})) {
    record("clone", {*this}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  }
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  Tensor out = Tensor::empty(shape(), dtype, device());
  out.copy_(*this);
  if (needs_grad({this}) && is_floating(dtype)) {
    record("to_dtype", {*this}, {out}, [from = this->dtype()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(from)};
    });
  }
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor out = Tensor::empty(shape(), dtype(), device);
  out.copy_(*this);
  if (needs_grad({this})) {
    record("to_device", {*this}, {out}, [from = this->device()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(from)};
    });
  }
  return out;
}

}  // namespace memtrain
