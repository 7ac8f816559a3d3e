// softmax and log_softmax along any dim. The input is viewed as (outer, C, inner) around `dim`; the
// forward saves only its output, which is all either backward needs. On a CUDA device the kernels of
// memtrain/cuda/nn.h run (f32, bf16 or f16), forward and backward. They reduce over the last dim of a contiguous
// array, so another dim (or a strided input) is first moved there by a transposed copy and moved back after.
#include "amp/autocast_state.h"
#include "cpu/softmax.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/nn.h"
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
  if (out.device().is_cuda()) {
    const char* op = log ? "log_softmax_backward" : "softmax_backward";
    const Layout l = layout_of(out.shape(), dim);
    detail::check_same_device(op, "output", out, "output gradient", dout);
    detail::check_cuda_same_dtype(op, "output gradient", dout, "output", out);
    // The gradient of a moved-back output arrives as a transposed view: the kernel reads it packed.
    const Tensor g = dout.contiguous();
    detail::check_cuda_data(op, "output gradient", g);
    Tensor dx = Tensor::empty(out.shape(), out.dtype(), out.device());
    if (log) {
      cuda::log_softmax_backward(dx.data_ptr(), g.data_ptr(), out.data_ptr(), out.dtype(), l.outer, l.C,
                                 out.device().index);
    } else {
      cuda::softmax_backward(dx.data_ptr(), g.data_ptr(), out.data_ptr(), out.dtype(), l.outer, l.C,
                             out.device().index);
    }
    return dx;
  }
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
  const std::int64_t dim = x.dim() == 0 ? 0 : detail::wrap_dim(op, dim_arg, x.dim());
  const Layout l = layout_of(x.shape(), dim);
  Tensor out;
  if (x.device().is_cuda() && (l.inner != 1 || !x.is_contiguous())) {
    // One transposed copy puts `dim` last; autograd runs back through the copies and transposes.
    const std::int64_t last = x.dim() - 1;
    return softmax_impl(op, x.transpose(dim, last).contiguous(), last, log).transpose(dim, last).contiguous();
  }
  if (x.device().is_cuda()) {
    detail::check_cuda_data(op, "input", x);
    out = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (log) {
      cuda::log_softmax_forward(out.data_ptr(), x.data_ptr(), x.dtype(), l.outer, l.C, x.device().index);
    } else {
      cuda::softmax_forward(out.data_ptr(), x.data_ptr(), x.dtype(), l.outer, l.C, x.device().index);
    }
  } else {
    detail::check_cpu(op, x);
    const Tensor xc = detail::compute_input(x);
    Tensor y = Tensor::empty(xc.shape(), xc.dtype());
    detail::dispatch_compute(op, xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (log) {
        cpu::log_softmax_forward<T>(y.data<T>(), xc.data<T>(), l.outer, l.C, l.inner);
      } else {
        cpu::softmax_forward<T>(y.data<T>(), xc.data<T>(), l.outer, l.C, l.inner);
      }
    });
    out = detail::as_dtype(y, x.dtype());
  }
  if (autograd::needs_grad({&x})) {
    SavedTensor saved(out);
    autograd::record(op, {x}, {out}, [saved, dim, log](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{softmax_backward(g[0], saved.unpack(), dim, log)};
    });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) {
  if (auto c = amp::detail::autocast_to_f32({x})) return softmax((*c)[0], dim);
  return softmax_impl("softmax", x, dim, false);
}
Tensor log_softmax(const Tensor& x, std::int64_t dim) {
  if (auto c = amp::detail::autocast_to_f32({x})) return log_softmax((*c)[0], dim);
  return softmax_impl("log_softmax", x, dim, true);
}

}  // namespace memtrain::ops
