// conv2d (NCHW, stride, padding, groups): on the CPU by im2col + GEMM, or by direct loops for depthwise
// convolutions (see cpu/conv.h). The forward saves x only when the weight needs a gradient and the weight only
// when x does (dW needs x, dx needs W). Column and padded-plane buffers are workspace, freed on return. Kernels: the device's backend (src/core/backend.h; src/cpu/conv.cpp,
// src/cuda/cuda_nn_backend.cpp: cuDNN or its im2col fallback; f32, bf16 or f16, one dtype for x, weight, bias
// and the gradients).
#include "core/backend.h"
#include "cpu/conv.h"  // Conv2dShape and conv_out_size: the output size rule
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"


namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

struct ConvGrads {
  Tensor dx, dw, db;
};

ConvGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Shape& x_shape,
                          const Shape& w_shape, std::int64_t stride, std::int64_t padding, std::int64_t groups,
                          DType x_dtype, DType w_dtype, DType b_dtype, bool want_dx, bool want_dw, bool want_db) {
  const Device dev = dout.device();
  const ConvGrads r{want_dx ? Tensor::empty(x_shape, x_dtype, dev) : Tensor(),
                    want_dw ? Tensor::empty(w_shape, w_dtype, dev) : Tensor(),
                    want_db ? Tensor::empty({w_shape[0]}, b_dtype, dev) : Tensor()};
  ::memtrain::detail::backend_for(dev).conv2d_backward(r.dx, r.dw, r.db, dout, x, weight, x_shape, w_shape, stride,
                                                       padding, groups);
  return r;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t stride, std::int64_t padding,
              std::int64_t groups) {
  const char* op = "conv2d";
  if (auto c = detail::cast_mode_to_compute(x, weight, bias))
    return conv2d((*c)[0], (*c)[1], (*c)[2], stride, padding, groups);
  detail::check_floating(op, x);
  detail::check_same(op, x, weight);
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
  const Tensor out = detail::compute_or_replay(op, flops, [&] {
    const Tensor y = Tensor::empty({s.B, s.Cout, s.OH, s.OW}, x.dtype(), x.device());
    ::memtrain::detail::backend_for(x.device()).conv2d_forward(y, x, weight, bias, stride, padding, groups);
    return std::vector<Tensor>{y};
  })[0];
  if (grad) {
    const bool want_db = bias.defined() && bias.requires_grad();
    autograd::record(op, inputs, {out},
                     [sx, sw, xs = x.shape(), ws = weight.shape(), stride, padding, groups, want_dx, want_dw,
                      want_db, has_b = bias.defined(), xd = x.dtype(), wd = weight.dtype()](const std::vector<Tensor>& g) {
                       ConvGrads r = conv2d_backward(g[0], sx.unpack(), sw.unpack(), xs, ws, stride, padding, groups,
                                                     xd, wd, wd, want_dx, want_dw, want_db);
                       std::vector<Tensor> grads{r.dx, r.dw};
                       if (has_b) grads.push_back(r.db);
                       return grads;
                     });
  }
  return out;
}

}  // namespace memtrain::ops
