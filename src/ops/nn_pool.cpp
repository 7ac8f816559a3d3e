// max_pool2d and avg_pool2d over [B, C, H, W] (or [C, H, W]) with square windows; stride 0 means stride =
// kernel. max_pool2d saves x (the backward recomputes each window's argmax rather than storing indices);
// avg_pool2d saves nothing. Kernels: the device's backend (src/core/backend.h; src/cpu/pool.cpp,
// src/cuda/cuda_nn_backend.cpp: f32, bf16 or f16, same rules).
#include "core/backend.h"
#include "cpu/pool.h"  // Pool2dShape: the output size rule
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

namespace {

cpu::Pool2dShape pool_shape(const char* op, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                            std::int64_t padding) {
  detail::check_floating(op, x);
  MT_CHECK(x.dim() == 3 || x.dim() == 4, op, "expects [B, C, H, W] or [C, H, W], got {}", shape_str(x.shape()));
  if (stride == 0) stride = kernel;
  MT_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel, op,
           "needs kernel >= 1, stride >= 0, 0 <= padding <= kernel/2, got kernel {}, stride {}, padding {}", kernel,
           stride, padding);
  std::int64_t planes = 1;
  for (std::int64_t d = 0; d < x.dim() - 2; ++d) planes *= x.size(d);
  cpu::Pool2dShape s{planes, x.size(-2), x.size(-1), kernel, stride, padding, 0, 0};
  s.OH = (s.H + 2 * padding - kernel) / stride + 1;
  s.OW = (s.W + 2 * padding - kernel) / stride + 1;
  MT_CHECK(s.H + 2 * padding >= kernel && s.W + 2 * padding >= kernel, op,
           "kernel {} does not fit input {} with padding {}", kernel, shape_str(x.shape()), padding);
  return s;
}

Shape out_shape(const Tensor& x, const cpu::Pool2dShape& s) {
  Shape shape = x.shape();
  shape[shape.size() - 2] = s.OH;
  shape[shape.size() - 1] = s.OW;
  return shape;
}

Tensor pool(const char* op, const Tensor& x, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
            bool is_max) {
  const cpu::Pool2dShape s = pool_shape(op, x, kernel, stride, padding);
  const Tensor out = Tensor::empty(out_shape(x, s), x.dtype(), x.device());
  ::memtrain::detail::backend_for(x.device()).pool2d_forward(out, x, s.kernel, s.stride, s.padding, is_max);
  if (autograd::needs_grad({&x})) {
    autograd::SavedTensor sx(is_max ? x : Tensor());
    autograd::record(op, {x}, {out},
                     [sx, s, is_max, shape = x.shape(), dtype = x.dtype()](const std::vector<Tensor>& g) {
                       const Tensor dx = Tensor::empty(shape, dtype, g[0].device());
                       ::memtrain::detail::backend_for(g[0].device())
                           .pool2d_backward(dx, g[0], sx.unpack(), s.kernel, s.stride, s.padding, is_max);
                       return std::vector<Tensor>{dx};
                     });
  }
  return out;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  return pool("max_pool2d", x, kernel, stride, padding, true);
}

Tensor avg_pool2d(const Tensor& x, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  return pool("avg_pool2d", x, kernel, stride, padding, false);
}

}  // namespace memtrain::ops
