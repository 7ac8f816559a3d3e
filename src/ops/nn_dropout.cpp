// dropout: the mask is a pure function of an RngState (see cpu/dropout.h), so the forward reserves its
// Philox blocks from the default stream and saves nothing but that state; the backward op regenerates the
// same mask. Under checkpoint recomputation the restored stream state replays the same mask again.
// Kernels: the device's backend (src/core/backend.h; src/cpu/dropout.cpp, src/cuda/cuda_nn_backend.cpp), each
// applying the same mask rule to the same reserved blocks, so one seed gives one mask on every device.
#include "core/backend.h"
#include "cpu/dropout.h"  // dropout_rng_blocks: the blocks one call draws, on every backend
#include "memtrain/autograd/node.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

namespace {

Tensor dropout_backward(const Tensor& dout, double p, RngState state, DType dtype) {
  const Tensor dx = Tensor::empty(dout.shape(), dtype, dout.device());
  ::memtrain::detail::backend_for(dout.device()).dropout_backward(dx, dout, p, state);
  return dx;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  const char* op = "dropout";
  detail::check_floating(op, x);
  MT_CHECK(p >= 0.0 && p <= 1.0, op, "p must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;
  // Every backend draws the CPU rule's blocks, block for block: one seed gives one mask on every device.
  const RngState state = reserve_rng_blocks(cpu::dropout_rng_blocks(x.numel()));
  const Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  ::memtrain::detail::backend_for(x.device()).dropout_forward(out, x, p, state);
  if (autograd::needs_grad({&x})) {
    autograd::record(op, {x}, {out}, [p, state, dtype = x.dtype()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{dropout_backward(g[0], p, state, dtype)};
    });
  }
  return out;
}

}  // namespace memtrain::ops
