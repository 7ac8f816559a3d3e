// softmax and log_softmax along any dim. The input is viewed as (outer, C, inner) around `dim`; the
// forward saves only its output, which is all either backward needs.
#include "cpu/softmax.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

struct Layout {
  std::int64_t outer = 1, C = 1, inner = 1;
};

Layout layout_of(const Shape& shape, std::int64_t dim) {
  Layout l;
  for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
    if (d < dim) l.outer *= shape[d];
    if (d == dim) l.C = shape[d];
    if (d > dim) l.inner *= shape[d];
  }
  return l;
}

// The backward op: dx from the output gradient and the forward output (its own kernel, not differentiable).
Tensor softmax_backward(const Tensor& dout, const Tensor& out, std::int64_t dim, bool log) {
  const Tensor g = detail::compute_input(dout), y = detail::compute_input(out);
  const Layout l = layout_of(y.shape(), dim);
  Tensor dx = Tensor::empty(y.shape(), y.dtype());
  detail::dispatch_compute(log ? "log_softmax_backward" : "softmax_backward", y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (log) {
      cpu::log_softmax_backward<T>(dx.data<T>(), g.data<T>(), y.data<T>(), l.outer, l.C, l.inner);
    } else {
      cpu::softmax_backward<T>(dx.data<T>(), g.data<T>(), y.data<T>(), l.outer, l.C, l.inner);
    }
  });
  return detail::as_dtype(dx, out.dtype());
}

Tensor softmax_impl(const char* op, const Tensor& x, std::int64_t dim_arg, bool log) {
  detail::check_floating(op, x);
  detail::check_cpu(op, x);
  const std::int64_t dim = x.dim() == 0 ? 0 : detail::wrap_dim(op, dim_arg, x.dim());
  const Tensor xc = detail::compute_input(x);
  const Layout l = layout_of(xc.shape(), dim);
  Tensor y = Tensor::empty(xc.shape(), xc.dtype());
  detail::dispatch_compute(op, xc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (log) {
      cpu::log_softmax_forward<T>(y.data<T>(), xc.data<T>(), l.outer, l.C, l.inner);
    } else {
      cpu::softmax_forward<T>(y.data<T>(), xc.data<T>(), l.outer, l.C, l.inner);
    }
  });
  Tensor out = detail::as_dtype(y, x.dtype());
  if (autograd::needs_grad({&x})) {
    SavedTensor saved(out);
    autograd::record(op, {x}, {out}, [saved, dim, log](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{softmax_backward(g[0], saved.unpack(), dim, log)};
    });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) { return softmax_impl("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, std::int64_t dim) { return softmax_impl("log_softmax", x, dim, true); }

}  // namespace memtrain::ops
