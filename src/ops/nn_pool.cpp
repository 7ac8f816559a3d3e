// max_pool2d and avg_pool2d over [B, C, H, W] (or [C, H, W]) with square windows; stride 0 means stride =
// kernel. max_pool2d saves x (the backward recomputes each window's argmax rather than storing indices);
// avg_pool2d saves nothing. On a CUDA device the kernels of memtrain/cuda/nn_spatial.h run instead (f32 or
// bf16, same rules).
#include "cpu/pool.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/nn_spatial.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

namespace memtrain::ops {

namespace {

cpu::Pool2dShape pool_shape(const char* op, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                            std::int64_t padding) {
  detail::check_floating(op, x);
  if (!x.device().is_cuda()) detail::check_cpu(op, x);
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

cuda::Pool2dShape cuda_shape(const cpu::Pool2dShape& s) {
  return {s.planes, s.H, s.W, s.kernel, s.stride, s.padding, s.OH, s.OW};
}

// An operand of the CUDA kernels: dtype `dtype` (f32, bf16 or f16), packed contiguous when it is not.
Tensor cuda_operand(const char* op, const char* what, const Tensor& t, DType dtype) {
  MT_CHECK(t.dtype() == dtype, op, "{} {} {} does not have the input's dtype {}", what, dtype_name(t.dtype()),
           shape_str(t.shape()), dtype_name(dtype));
  const Tensor c = t.detach().contiguous();
  detail::check_cuda_data(op, what, c);
  return c;
}

Tensor pool_backward_cuda(const char* op, const Tensor& dout, const Tensor& x, const Shape& x_shape, DType x_dtype,
                          const cpu::Pool2dShape& s, bool is_max) {
  const Tensor g = cuda_operand(op, "output gradient", dout, x_dtype);
  Tensor dx = Tensor::empty(x_shape, x_dtype, g.device());
  if (is_max) {
    detail::check_same_device(op, "input", x, "output gradient", g);
    const Tensor xc = cuda_operand(op, "input", x, x_dtype);
    cuda::max_pool2d_backward(dx.data_ptr(), g.data_ptr(), xc.data_ptr(), x_dtype, cuda_shape(s), g.device().index);
  } else {
    cuda::avg_pool2d_backward(dx.data_ptr(), g.data_ptr(), x_dtype, cuda_shape(s), g.device().index);
  }
  return dx;
}

Tensor pool_backward(const char* op, const Tensor& dout, const Tensor& x, const Shape& x_shape, DType x_dtype,
                     const cpu::Pool2dShape& s, bool is_max) {
  if (dout.device().is_cuda()) return pool_backward_cuda(op, dout, x, x_shape, x_dtype, s, is_max);
  const Tensor g = detail::compute_input(dout);
  const Tensor xc = is_max ? detail::compute_input(x) : Tensor();
  Tensor dx = Tensor::empty(x_shape, g.dtype());
  detail::dispatch_compute(op, g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (is_max) {
      cpu::max_pool2d_backward<T>(dx.data<T>(), g.data<T>(), xc.data<T>(), s);
    } else {
      cpu::avg_pool2d_backward<T>(dx.data<T>(), g.data<T>(), s);
    }
  });
  return detail::as_dtype(dx, x_dtype);
}

Tensor pool(const char* op, const Tensor& x, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
            bool is_max) {
  const cpu::Pool2dShape s = pool_shape(op, x, kernel, stride, padding);
  Tensor out;
  if (x.device().is_cuda()) {
    const Tensor xc = cuda_operand(op, "input", x, x.dtype());
    out = Tensor::empty(out_shape(x, s), x.dtype(), x.device());
    if (is_max) {
      cuda::max_pool2d_forward(out.data_ptr(), xc.data_ptr(), x.dtype(), cuda_shape(s), x.device().index);
    } else {
      cuda::avg_pool2d_forward(out.data_ptr(), xc.data_ptr(), x.dtype(), cuda_shape(s), x.device().index);
    }
  } else {
    const Tensor xc = detail::compute_input(x);
    Tensor y = Tensor::empty(out_shape(x, s), xc.dtype());
    detail::dispatch_compute(op, xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (is_max) {
        cpu::max_pool2d_forward<T>(y.data<T>(), xc.data<T>(), s);
      } else {
        cpu::avg_pool2d_forward<T>(y.data<T>(), xc.data<T>(), s);
      }
    });
    out = detail::as_dtype(y, x.dtype());
  }
  if (autograd::needs_grad({&x})) {
    autograd::SavedTensor sx(is_max ? x : Tensor());
    autograd::record(op, {x}, {out},
                     [op, sx, s, is_max, shape = x.shape(), dtype = x.dtype()](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{pool_backward(op, g[0], sx.unpack(), shape, dtype, s, is_max)};
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
