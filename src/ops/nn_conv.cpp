// conv2d (NCHW, stride, padding, groups) by im2col + GEMM (see cpu/conv.h). The forward saves x only when
// the weight needs a gradient and the weight only when x does (dW needs x, dx needs W). Column buffers are
// workspace, freed on return. On a CUDA device memtrain/cuda/conv.h runs instead (cuDNN or its im2col
// fallback; f32, bf16 or f16, one dtype for x, weight, bias and the gradients).
#include "amp/autocast_state.h"
#include "cpu/conv.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/conv.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

#include <algorithm>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

struct ConvGrads {
  Tensor dx, dw, db;
};

cuda::Conv2dShape cuda_shape(const cpu::Conv2dShape& s) {
  return {s.B, s.Cin, s.H, s.W, s.Cout, s.KH, s.KW, s.stride, s.padding, s.groups, s.OH, s.OW};
}

// An operand of the CUDA kernels: the dtype of `ref` (f32, bf16 or f16), packed contiguous when it is not.
Tensor cuda_operand(const char* op, const char* what, const Tensor& t, const Tensor& ref) {
  detail::check_same_device(op, "input", ref, what, t);
  detail::check_cuda_same_dtype(op, what, t, "input", ref);
  const Tensor c = t.detach().contiguous();
  detail::check_cuda_data(op, what, c);
  return c;
}

ConvGrads conv2d_backward_cuda(const Tensor& dout, const Tensor& x, const Tensor& weight, const cpu::Conv2dShape& s,
                               bool want_dx, bool want_dw, bool want_db) {
  const char* op = "conv2d_backward";
  // A saved tensor holds the forward's dtype and device (none is saved when only db is wanted).
  const Tensor& ref = want_dw ? x : (want_dx ? weight : dout);
  const Tensor g = cuda_operand(op, "output gradient", dout, ref);
  const Tensor xc = want_dw ? cuda_operand(op, "input", x, ref) : Tensor();
  const Tensor wc = want_dx ? cuda_operand(op, "weight", weight, ref) : Tensor();
  const Device dev = g.device();
  Tensor dx = want_dx ? Tensor::empty({s.B, s.Cin, s.H, s.W}, g.dtype(), dev) : Tensor();
  Tensor dw = want_dw ? Tensor::empty({s.Cout, s.Cin / s.groups, s.KH, s.KW}, g.dtype(), dev) : Tensor();
  Tensor db = want_db ? Tensor::empty({s.Cout}, g.dtype(), dev) : Tensor();
  auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  cuda::conv2d_backward(ptr(dx), ptr(dw), ptr(db), g.data_ptr(), ptr(xc), ptr(wc), g.dtype(), cuda_shape(s), dev.index);
  return {dx, dw, db};
}

ConvGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const cpu::Conv2dShape& s,
                          DType x_dtype, DType w_dtype, DType b_dtype, bool want_dx, bool want_dw, bool want_db) {
  if (dout.device().is_cuda()) return conv2d_backward_cuda(dout, x, weight, s, want_dx, want_dw, want_db);
  const Tensor g = detail::compute_input(dout);
  const Tensor xc = want_dw ? detail::compute_input(x) : Tensor();
  const Tensor wc = want_dx ? detail::compute_input(weight) : Tensor();
  Tensor dx = want_dx ? Tensor::empty({s.B, s.Cin, s.H, s.W}, g.dtype()) : Tensor();
  Tensor dw = want_dw ? Tensor::empty({s.Cout, s.Cin / s.groups, s.KH, s.KW}, g.dtype()) : Tensor();
  Tensor db = want_db ? Tensor::empty({s.Cout}, g.dtype()) : Tensor();
  const int nthreads = detail::max_threads();
  const Tensor ws = detail::workspace(cpu::conv2d_backward_workspace(s, nthreads), g.dtype());
  detail::dispatch_compute("conv2d_backward", g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    cpu::conv2d_backward<T>(ptr(dx), ptr(dw), ptr(db), g.data<T>(), ptr(xc), ptr(wc), s, ws.data<T>(), nthreads);
  });
  return {want_dx ? detail::as_dtype(dx, x_dtype) : Tensor(), want_dw ? detail::as_dtype(dw, w_dtype) : Tensor(),
          want_db ? detail::as_dtype(db, b_dtype) : Tensor()};
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t stride, std::int64_t padding,
              std::int64_t groups) {
  const char* op = "conv2d";
  if (auto c = amp::detail::autocast_to_compute({x, weight, bias}))
    return conv2d((*c)[0], (*c)[1], (*c)[2], stride, padding, groups);
  detail::check_floating(op, x);
  detail::check_same(op, x, weight);
  if (x.device().is_cuda()) {
    MT_CHECK(detail::is_cuda_kernel_dtype(x.dtype()), op,
             "input of dtype {} on {} is not supported yet: the CUDA kernels take f32, bf16 or f16", dtype_name(x.dtype()),
             x.device().str());
  } else {
    detail::check_cpu(op, x);
  }
  MT_CHECK(x.dim() == 4 && weight.dim() == 4, op, "expects x [B, Cin, H, W] and weight [Cout, Cin/groups, KH, KW], got {} and {}",
           shape_str(x.shape()), shape_str(weight.shape()));
  MT_CHECK(stride >= 1 && padding >= 0 && groups >= 1, op, "needs stride >= 1, padding >= 0, groups >= 1, got {}, {}, {}",
           stride, padding, groups);
  cpu::Conv2dShape s{x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0), weight.size(2), weight.size(3),
                     stride, padding, groups, 0, 0};
  MT_CHECK(s.Cin % groups == 0 && s.Cout % groups == 0 && weight.size(1) == s.Cin / groups, op,
           "x {} and weight {} do not fit groups={} (Cin and Cout must divide by groups, weight dim 1 = Cin/groups)",
           shape_str(x.shape()), shape_str(weight.shape()), groups);
  s.OH = cpu::conv_out_size(s.H, s.KH, stride, padding);
  s.OW = cpu::conv_out_size(s.W, s.KW, stride, padding);
  // The padded input must hold one whole window: conv_out_size's division rounds toward zero, so
  // (H + 2p - KH) in (-stride, 0) would still give one output row computed over phantom zeros.
  MT_CHECK(s.OH >= 1 && s.OW >= 1 && s.KH >= 1 && s.KW >= 1 && s.H + 2 * padding >= s.KH &&
               s.W + 2 * padding >= s.KW,
           op,
           "kernel {}x{} does not fit input {} with padding {}", s.KH, s.KW, shape_str(x.shape()), padding);
  if (bias.defined()) {
    detail::check_same(op, x, bias);
    MT_CHECK(bias.dim() == 1 && bias.size(0) == s.Cout, op, "bias {} does not match weight {}",
             shape_str(bias.shape()), shape_str(weight.shape()));
  }
  const double flops = 2.0 * static_cast<double>(s.B * s.Cout * s.OH * s.OW) *
                       static_cast<double>(s.Cin / groups * s.KH * s.KW);
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  // Saved before the convolution, so a checkpoint re-run that only needs x again stops before computing it.
  const bool grad = autograd::needs_grad(inputs);
  const bool want_dx = grad && x.requires_grad(), want_dw = grad && weight.requires_grad();
  const SavedTensor sx(want_dw ? x : Tensor()), sw(want_dx ? weight : Tensor());
  const Tensor out = ckpt::detail::compute_or_replay(op, flops, [&] {
    if (x.device().is_cuda()) {
      const Tensor xc = cuda_operand(op, "input", x, x), wc = cuda_operand(op, "weight", weight, x);
      const Tensor bc = bias.defined() ? cuda_operand(op, "bias", bias, x) : Tensor();
      Tensor y = Tensor::empty({s.B, s.Cout, s.OH, s.OW}, x.dtype(), x.device());
      cuda::conv2d_forward(y.data_ptr(), xc.data_ptr(), wc.data_ptr(), bc.defined() ? bc.data_ptr() : nullptr,
                           x.dtype(), cuda_shape(s), x.device().index);
      return std::vector<Tensor>{y};
    }
    const Tensor xc = detail::compute_input(x), wc = detail::compute_input(weight);
    const Tensor bc = bias.defined() ? detail::compute_input(bias) : Tensor();
    Tensor y = Tensor::empty({s.B, s.Cout, s.OH, s.OW}, xc.dtype());
    const int nthreads = detail::max_threads();
    const Tensor ws = detail::workspace(std::max<std::int64_t>(cpu::conv2d_forward_workspace(s, nthreads), 1),
                                        xc.dtype());
    detail::dispatch_compute(op, xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::conv2d_forward<T>(y.data<T>(), xc.data<T>(), wc.data<T>(), bc.defined() ? bc.data<T>() : nullptr, s,
                             ws.data<T>(), nthreads);
    });
    return std::vector<Tensor>{detail::as_dtype(y, x.dtype())};
  })[0];
  if (grad) {
    const bool want_db = bias.defined() && bias.requires_grad();
    autograd::record(op, inputs, {out},
                     [sx, sw, s, want_dx, want_dw, want_db, has_b = bias.defined(), xd = x.dtype(),
                      wd = weight.dtype()](const std::vector<Tensor>& g) {
                       ConvGrads r = conv2d_backward(g[0], sx.unpack(), sw.unpack(), s, xd, wd, wd, want_dx, want_dw,
                                                     want_db);
                       std::vector<Tensor> grads{r.dx, r.dw};
                       if (has_b) grads.push_back(r.db);
                       return grads;
                     });
  }
  return out;
}

}  // namespace memtrain::ops
