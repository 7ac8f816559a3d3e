// Reductions: sum, mean, max, argmax, and sum_to (broadcast backward).
#include "memtrain/ops/reduce.h"

#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/core/allocator.h"
#include "memtrain/cuda/reduce.h"
#include "memtrain/ops/elementwise.h"
#include "ops/elementwise_common.h"

#include <algorithm>
#include <cmath>

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

// Sums into a float64 buffer (exact enough for any f32 input size) shaped like `keep`.
Tensor sum_kernel(const Tensor& a, const Shape& keep) {
  const Tensor x = detail::to_compute(a);
  Tensor acc = zeros(keep, DType::f64);
  const Shape acc_strides = detail::broadcast_strides(acc, a.shape());
  double* o = acc.data<double>();
  detail::dispatch_compute("sum", x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = x.data<T>();
    cpu::for_each_run<2>(a.shape(), {&x.strides(), &acc_strides}, [&](auto off, std::int64_t n, auto inner) {
      if (inner[1] == 0) {
        double s = 0;
        for (std::int64_t j = 0; j < n; ++j) s += static_cast<double>(p[off[0] + j * inner[0]]);
        o[off[1]] += s;
      } else {
        for (std::int64_t j = 0; j < n; ++j) o[off[1] + j * inner[1]] += static_cast<double>(p[off[0] + j * inner[0]]);
      }
    });
  });
  return acc.to(a.dtype());
}

// The CUDA sum: `a` as a contiguous [outer, reduce, inner] array for cuda::sum_dim. A contiguous input
// whose reduced dims (ignoring size-1 dims) are adjacent is used in place; otherwise the kept dims are
// moved first and the reduced dims last in one strided copy (reduce = their product, inner = 1).
Tensor sum_cuda(const Tensor& a, const std::vector<bool>& mask, const Shape& keep) {
  Tensor out = Tensor::empty(keep, a.dtype(), a.device());
  const Shape& s = a.shape();
  const std::size_t rank = s.size();
  std::size_t first = rank, last = 0;  // the first and last reduced dims of size != 1
  for (std::size_t i = 0; i < rank; ++i) {
    if (mask[i] && s[i] != 1) {
      first = std::min(first, i);
      last = i;
    }
  }
  bool in_place = a.is_contiguous();
  for (std::size_t i = first; in_place && i < last; ++i) in_place = mask[i] || s[i] == 1;
  Tensor x = a.detach();
  std::int64_t outer = 1, reduce = 1, inner = 1;
  if (in_place) {  // (when nothing of size > 1 is reduced, first == rank: all outer, a copy)
    for (std::size_t i = 0; i < rank; ++i) (i < first ? outer : i <= last ? reduce : inner) *= s[i];
  } else {
    Shape perm;
    for (std::size_t i = 0; i < rank; ++i)
      if (!mask[i]) perm.push_back(static_cast<std::int64_t>(i));
    for (std::size_t i = 0; i < rank; ++i)
      if (mask[i]) perm.push_back(static_cast<std::int64_t>(i));
    CategoryGuard category(MemoryCategory::workspace);  // freed when this returns
    x = x.permute(perm).contiguous();
    outer = out.numel();
    reduce = outer == 0 ? 0 : a.numel() / outer;
  }
  cuda::sum_dim(x.numel() == 0 ? nullptr : x.data_ptr(), out.data_ptr(), a.dtype(), outer, reduce, inner,
                a.device().index);
  return out;
}

// Values (a's dtype) and i64 positions of the first maximum along dim d, both shaped like `a` with dim d
// set to 1. NaN counts as larger than any number, so a NaN in a row propagates (as in PyTorch).
struct MaxResult {
  Tensor values;
  Tensor indices;
};

// On CUDA: a contiguous copy (when needed) viewed as [outer, n, inner] for cuda::max_dim; `values` may be
// skipped (argmax).
MaxResult max_cuda(const Tensor& a, std::int64_t d, const Shape& keep, bool want_values) {
  Tensor x = a;
  if (!x.is_contiguous()) {
    CategoryGuard category(MemoryCategory::workspace);  // freed when this returns
    x = x.contiguous();
  }
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t k = 0; k < a.dim(); ++k) (k < d ? outer : inner) *= k == d ? 1 : a.shape()[k];
  MaxResult r;
  if (want_values) r.values = Tensor::empty(keep, a.dtype(), a.device());
  r.indices = Tensor::empty(keep, DType::i64, a.device());
  if (r.indices.numel() == 0) return r;  // another dim is empty: nothing to compute
  cuda::max_dim(x.data_ptr(), want_values ? r.values.data_ptr() : nullptr, r.indices.data<std::int64_t>(), a.dtype(),
                outer, a.shape()[d], inner, a.device().index);
  return r;
}

MaxResult max_kernel(const char* op, const Tensor& a, std::int64_t d, bool want_values = true) {
  const std::int64_t n = a.shape()[d];
  MT_CHECK(n > 0, op, "cannot reduce over dimension {} of size 0 (input {})", d, shape_str(a.shape()));
  Shape keep = a.shape();
  keep[d] = 1;
  if (a.device().is_cuda()) return max_cuda(a, d, keep, want_values);
  detail::check_cpu(op, a);
  const Tensor x = detail::to_compute(a);
  Tensor values = Tensor::empty(keep, x.dtype());
  Tensor indices = Tensor::empty(keep, DType::i64);
  const Shape& xs = x.strides();
  const std::int64_t step = xs[d], rank = a.dim(), count = shape_numel(keep);
  std::int64_t* idx = indices.data<std::int64_t>();
  detail::dispatch_compute(op, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = x.data<T>();
    T* val = values.data<T>();
    // One output per iteration; its input offset is unravelled from the flat index (rank ops, cheap next to
    // the n-element scan), which lets the rows run in parallel.
#pragma omp parallel for if (count * n > cpu::kParallelGrain)
    for (std::int64_t i = 0; i < count; ++i) {
      std::int64_t rest = i, base = 0;
      for (std::int64_t k = rank - 1; k >= 0; --k) {
        base += (rest % keep[k]) * xs[k];
        rest /= keep[k];
      }
      T best = p[base];
      std::int64_t best_j = 0;
      for (std::int64_t j = 1; j < n && !std::isnan(best); ++j) {
        const T v = p[base + j * step];
        if (v > best || std::isnan(v)) {
          best = v;
          best_j = j;
        }
      }
      val[i] = best;
      idx[i] = best_j;
    }
  });
  return {values.to(a.dtype()), indices};
}

}  // namespace

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim) {
  detail::check_floating("sum", a);
  const std::vector<bool> mask = reduced_mask("sum", a, dims);
  const Shape keep = keepdim_shape(a, mask);
  Tensor out;
  if (a.device().is_cuda()) {
    out = sum_cuda(a, mask, keep);
  } else {
    detail::check_cpu("sum", a);
    out = sum_kernel(a, keep);
  }
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
