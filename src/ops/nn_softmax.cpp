// softmax and log_softmax along any dim. The input is viewed as (outer, C, inner) around `dim`; the
// forward saves only its output, which is all either backward needs. Kernels: the device's backend
// (src/core/backend.h; src/cpu/softmax.cpp, src/cuda/cuda_nn_backend.cpp).
#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

// The backward op: dx from the output gradient and the forward output (its own kernel, not differentiable).
Tensor softmax_backward(const Tensor& dout, const Tensor& out, std::int64_t dim, bool log) {
  detail::check_same_device(log ? "log_softmax_backward" : "softmax_backward", "output", out, "output gradient", dout);
  const Tensor dx = Tensor::empty(out.shape(), out.dtype(), out.device());
  ::memtrain::detail::backend_for(out.device()).softmax_backward(dx, dout, out, dim, log);
  return dx;
}

Tensor softmax_impl(const char* op, const Tensor& x, std::int64_t dim_arg, bool log) {
  detail::check_floating(op, x);
  const std::int64_t dim = x.dim() == 0 ? 0 : detail::wrap_dim(op, dim_arg, x.dim());
  const Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  ::memtrain::detail::backend_for(x.device()).softmax_forward(out, x, dim, log);
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
  if (auto c = detail::cast_mode_to_f32(x)) return softmax((*c)[0], dim);
  return softmax_impl("softmax", x, dim, false);
}
Tensor log_softmax(const Tensor& x, std::int64_t dim) {
  if (auto c = detail::cast_mode_to_f32(x)) return log_softmax((*c)[0], dim);
  return softmax_impl("log_softmax", x, dim, true);
}

}  // namespace memtrain::ops
