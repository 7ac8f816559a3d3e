// dropout: the mask is a pure function of an RngState (see cpu/dropout.h), so the forward reserves its
// Philox blocks from the default stream and saves nothing but that state; the backward op regenerates the
// same mask. Under checkpoint recomputation the restored stream state replays the same mask again.
// On a CUDA device the kernels of memtrain/cuda/nn.h apply the same mask rule to the same reserved blocks,
// so one seed gives one mask on either device.
#include "cpu/dropout.h"
#include "memtrain/autograd/node.h"
#include "memtrain/cuda/nn.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

namespace {

Tensor dropout_backward(const Tensor& dout, double p, RngState state, DType dtype) {
  if (dout.device().is_cuda()) {
    const char* op = "dropout_backward";
    MT_CHECK(dout.dtype() == dtype, op, "output gradient {} {} on {} is not supported yet: expected {}",
             dtype_name(dout.dtype()), shape_str(dout.shape()), dout.device().str(), dtype_name(dtype));
    detail::check_cuda_data(op, "output gradient", dout);
    Tensor dx = Tensor::empty(dout.shape(), dout.dtype(), dout.device());
    cuda::dropout_backward(dx.data_ptr(), dout.data_ptr(), dout.dtype(), static_cast<std::size_t>(dout.numel()), p,
                           state, dout.device().index);
    return dx;
  }
  const Tensor g = detail::compute_input(dout);
  Tensor dx = Tensor::empty(g.shape(), g.dtype());
  detail::dispatch_compute("dropout_backward", g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::dropout_backward<T>(dx.data<T>(), g.data<T>(), g.numel(), p, state);
  });
  return detail::as_dtype(dx, dtype);
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  const char* op = "dropout";
  detail::check_floating(op, x);
  MT_CHECK(p >= 0.0 && p <= 1.0, op, "p must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;
  Tensor out;
  RngState state;
  if (x.device().is_cuda()) {
    detail::check_cuda_data(op, "input", x);
    state = reserve_rng_blocks(cpu::dropout_rng_blocks(x.numel()));  // the CPU path's draw, block for block
    out = Tensor::empty(x.shape(), x.dtype(), x.device());
    cuda::dropout_forward(out.data_ptr(), x.data_ptr(), x.dtype(), static_cast<std::size_t>(x.numel()), p, state,
                          x.device().index);
  } else {
    detail::check_cpu(op, x);
    const Tensor xc = detail::compute_input(x);
    state = reserve_rng_blocks(cpu::dropout_rng_blocks(xc.numel()));
    Tensor y = Tensor::empty(xc.shape(), xc.dtype());
    detail::dispatch_compute(op, xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::dropout_forward<T>(y.data<T>(), xc.data<T>(), xc.numel(), p, state);
    });
    out = detail::as_dtype(y, x.dtype());
  }
  if (autograd::needs_grad({&x})) {
    autograd::record(op, {x}, {out}, [p, state, dtype = x.dtype()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{dropout_backward(g[0], p, state, dtype)};
    });
  }
  return out;
}

}  // namespace memtrain::ops
