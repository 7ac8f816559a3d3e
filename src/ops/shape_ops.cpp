// Joining and splitting: concat copies its inputs into one new tensor (backward hands each input its
// slice of the gradient); split and chunk return narrow() views of the input, recorded as one split node
// whose backward assembles the input's gradient once.
#include "memtrain/autograd/node.h"
#include "memtrain/ops/shape.h"
#include "ops/op_utils.h"

#include <algorithm>

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;

namespace {

// wrap_dim whose message also names the input's shape.
std::int64_t checked_dim(const char* op, std::int64_t dim, const Tensor& a) {
  MT_CHECK(a.dim() > 0, op, "needs a tensor of rank >= 1, got shape {}", shape_str(a.shape()));
  MT_CHECK(dim >= -a.dim() && dim < a.dim(), op, "dimension {} out of range for input {} of rank {}", dim,
           shape_str(a.shape()), a.dim());
  return dim < 0 ? dim + a.dim() : dim;
}

// The gradient of split's input from its pieces' gradients g (the engine has zero-filled missing ones).
// When the pieces' gradients already are consecutive slices of one tensor laid out like a contiguous
// `shape` (scaled_dot_product_attention writes dq, dk, dv so), that tensor is handed back as it is.
Tensor split_backward(const std::vector<Tensor>& g, const Shape& shape, const Shape& sizes, std::int64_t d) {
  const Shape dense = contiguous_strides(shape);
  const std::int64_t base_offset = g.front().offset();
  bool in_place = true;
  std::int64_t start = 0;
  for (std::size_t i = 0; i < g.size() && in_place; ++i) {
    Shape piece_shape = shape;
    piece_shape[d] = sizes[i];
    // Strides of a size-1 dim do not matter; compare the others.
    for (std::size_t k = 0; k < shape.size() && in_place; ++k)
      in_place = piece_shape[k] == 1 || g[i].strides()[k] == dense[k];
    in_place = in_place && g[i].shape() == piece_shape && g[i].dtype() == g.front().dtype() &&
               g[i].device() == g.front().device() && g[i].shares_storage_with(g.front()) &&
               g[i].offset() == base_offset + start * dense[d];
    start += sizes[i];
  }
  if (in_place) return Tensor::make_view(g.front().storage(), shape, dense, base_offset, g.front().dtype());
  Tensor dx = Tensor::empty(shape, g.front().dtype(), g.front().device());
  start = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (sizes[i] > 0) dx.narrow(d, start, sizes[i]).copy_(g[i]);
    start += sizes[i];
  }
  return dx;
}

}  // namespace

Tensor concat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  MT_CHECK(!tensors.empty(), "concat", "needs at least one tensor");
  const Tensor& first = tensors.front();
  detail::check_defined("concat", first);
  const std::int64_t d = checked_dim("concat", dim, first);
  Shape shape = first.shape();
  shape[d] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    detail::check_same("concat", first, t);
    bool matches = t.dim() == first.dim();
    for (std::int64_t k = 0; matches && k < t.dim(); ++k) matches = k == d || t.shape()[k] == first.shape()[k];
    MT_CHECK(matches, "concat", "tensor {} has shape {}, but tensor 0 has shape {}: all sizes except dim {} must match",
             i, shape_str(t.shape()), shape_str(first.shape()), d);
    shape[d] += t.shape()[d];
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  std::vector<std::int64_t> lengths;
  lengths.reserve(tensors.size());
  std::int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const std::int64_t n = t.shape()[d];
    if (n > 0) out.narrow(d, offset, n).copy_(t);  // out has no history yet, so narrow records nothing
    lengths.push_back(n);
    offset += n;
  }
  if (needs_grad(tensors)) {
    std::vector<bool> wanted;
    for (const Tensor& t : tensors) wanted.push_back(t.requires_grad());
    record("concat", tensors, {out}, [d, lengths, wanted](const std::vector<Tensor>& g) {
      std::vector<Tensor> grads(lengths.size());
      std::int64_t start = 0;
      for (std::size_t i = 0; i < lengths.size(); ++i) {
        if (wanted[i]) grads[i] = g[0].narrow(d, start, lengths[i]);
        start += lengths[i];
      }
      return grads;
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& a, const Shape& sizes, std::int64_t dim) {
  detail::check_defined("split", a);
  const std::int64_t d = checked_dim("split", dim, a);
  std::int64_t total = 0;
  for (auto s : sizes) {
    MT_CHECK(s >= 0, "split", "negative size {} in {}", s, shape_str(sizes));
    total += s;
  }
  MT_CHECK(total == a.shape()[d], "split", "sizes {} add up to {}, but dimension {} of input {} has size {}",
           shape_str(sizes), total, d, shape_str(a.shape()), a.shape()[d]);
  // Views of `a` recorded as one node (not one narrow node per piece), so the backward builds a's gradient
  // once instead of zero-filling and summing one full-size tensor per piece.
  const Tensor base = a.detach();
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  std::int64_t start = 0;
  for (auto s : sizes) {
    pieces.push_back(base.narrow(d, start, s));
    start += s;
  }
  if (needs_grad({&a})) {
    record("split", {a}, pieces, [shape = a.shape(), sizes, d](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{split_backward(g, shape, sizes, d)};
    });
  }
  return pieces;
}

// As in PyTorch: pieces of ceil(n / chunks) elements, the last one smaller; fewer than `chunks` pieces
// when n does not fill them (a dim of size 0 gives one empty piece).
std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, std::int64_t dim) {
  detail::check_defined("chunk", a);
  MT_CHECK(chunks > 0, "chunk", "number of chunks must be positive, got {} (input {})", chunks, shape_str(a.shape()));
  const std::int64_t d = checked_dim("chunk", dim, a);
  const std::int64_t n = a.shape()[d];
  const std::int64_t piece = std::max<std::int64_t>((n + chunks - 1) / chunks, 1);
  Shape sizes;
  for (std::int64_t start = 0; start < n; start += piece) sizes.push_back(std::min(piece, n - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(a, sizes, d);
}

}  // namespace memtrain::ops
