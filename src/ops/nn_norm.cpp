// layer_norm and rms_norm over the last dim. The forward saves x, the affine weight and the per-row
// statistics (layer_norm: mean, rstd; rms_norm: rstd), not the normalised output; the backward ops
// recompute x_hat from them. Statistics are kept in the compute dtype (f32 for bf16/f16 inputs).
// On a CUDA device the kernels of memtrain/cuda/nn.h run instead (f32, bf16 or f16, one dtype for x, weight
// and bias, contiguous; statistics always f32), forward and backward.
// batch_norm (NCHW, per channel; the rule of nn::BatchNorm2d): on CUDA the kernels of memtrain/cuda/nn_spatial.h
// with their own backward; on the CPU the composition of differentiable ops the module has always used.
#include "cpu/norm.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/nn.h"
#include "memtrain/cuda/nn_spatial.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

#include <algorithm>
#include <cstdint>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

// weight/bias must be [C] with the compute dtype of x (f32 weights with bf16 activations are fine).
void check_affine(const char* op, const char* what, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  detail::check_floating(op, p);
  detail::check_same_device(op, "input", x, what, p);
  MT_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), op, "{} {} does not match the last dim of input {}", what,
           shape_str(p.shape()), shape_str(x.shape()));
  MT_CHECK(detail::compute_dtype(p.dtype()) == detail::compute_dtype(x.dtype()) && p.device() == x.device(), op,
           "{} {} {} cannot be combined with input {} {}", what, dtype_name(p.dtype()), shape_str(p.shape()),
           dtype_name(x.dtype()), shape_str(x.shape()));
}

void check_input(const char* op, const Tensor& x) {
  detail::check_floating(op, x);
  MT_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, "needs an input with a non-empty last dim, got {}",
           shape_str(x.shape()));
}

// The CUDA kernels' contract for x and the affine parameters (checked after check_input/check_affine).
void check_cuda_operands(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_cuda_data(op, "input", x);
  for (const auto& [what, p] : {std::pair<const char*, const Tensor&>{"weight", weight}, {"bias", bias}}) {
    if (!p.defined()) continue;
    detail::check_cuda_same_dtype(op, what, p, "input", x);
    detail::check_cuda_data(op, what, p);
  }
}

// The output gradient reaching a CUDA backward: the forward output's dtype, contiguous.
void check_cuda_grad(const char* op, const Tensor& dout, const Tensor& x) {
  detail::check_same_device(op, "input", x, "output gradient", dout);
  detail::check_cuda_same_dtype(op, "output gradient", dout, "input", x);
  detail::check_cuda_data(op, "output gradient", dout);
}

// Inputs to record and the gradient slots they map to: undefined weight/bias take no edge.
std::vector<Tensor> defined_only(std::initializer_list<Tensor> ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts)
    if (t.defined()) out.push_back(t);
  return out;
}

struct NormGrads {
  Tensor dx, dw, db;
};

// The layer_norm backward op (own kernel). dw/db are computed only when wanted.
NormGrads layer_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool want_dw, bool want_db) {
  if (x.device().is_cuda()) {
    check_cuda_grad("layer_norm_backward", dout, x);
    const std::int64_t C = x.size(-1), N = x.numel() / C;
    const Device dev = x.device();
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), dev);
    Tensor dw = want_dw ? Tensor::empty({C}, x.dtype(), dev) : Tensor();
    Tensor db = want_db ? Tensor::empty({C}, x.dtype(), dev) : Tensor();
    cuda::layer_norm_backward(dx.data_ptr(), want_dw ? dw.data_ptr() : nullptr, want_db ? db.data_ptr() : nullptr,
                              dout.data_ptr(), x.data_ptr(), weight.defined() ? weight.data_ptr() : nullptr,
                              mean.data<float>(), rstd.data<float>(), x.dtype(), N, C, dev.index);
    return {dx, dw, db};
  }
  const Tensor g = detail::compute_input(dout), xc = detail::compute_input(x);
  const Tensor wc = weight.defined() ? detail::compute_input(weight) : Tensor();
  const std::int64_t C = xc.size(-1), N = xc.numel() / C;
  Tensor dx = Tensor::empty(xc.shape(), xc.dtype());
  Tensor dw = want_dw ? Tensor::empty({C}, xc.dtype()) : Tensor();
  Tensor db = want_db ? Tensor::empty({C}, xc.dtype()) : Tensor();
  detail::dispatch_compute("layer_norm_backward", xc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::layer_norm_backward<T>(dx.data<T>(), want_dw ? dw.data<T>() : nullptr, want_db ? db.data<T>() : nullptr,
                                g.data<T>(), xc.data<T>(), wc.defined() ? wc.data<T>() : nullptr, mean.data<T>(),
                                rstd.data<T>(), N, C);
  });
  return {detail::as_dtype(dx, x.dtype()), want_dw ? detail::as_dtype(dw, weight.dtype()) : Tensor(), db};
}

NormGrads rms_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            bool want_dw) {
  if (x.device().is_cuda()) {
    check_cuda_grad("rms_norm_backward", dout, x);
    const std::int64_t C = x.size(-1), N = x.numel() / C;
    const Device dev = x.device();
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), dev);
    Tensor dw = want_dw ? Tensor::empty({C}, x.dtype(), dev) : Tensor();
    cuda::rms_norm_backward(dx.data_ptr(), want_dw ? dw.data_ptr() : nullptr, dout.data_ptr(), x.data_ptr(),
                            weight.defined() ? weight.data_ptr() : nullptr, rstd.data<float>(), x.dtype(), N, C,
                            dev.index);
    return {dx, dw, Tensor()};
  }
  const Tensor g = detail::compute_input(dout), xc = detail::compute_input(x);
  const Tensor wc = weight.defined() ? detail::compute_input(weight) : Tensor();
  const std::int64_t C = xc.size(-1), N = xc.numel() / C;
  Tensor dx = Tensor::empty(xc.shape(), xc.dtype());
  Tensor dw = want_dw ? Tensor::empty({C}, xc.dtype()) : Tensor();
  detail::dispatch_compute("rms_norm_backward", xc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::rms_norm_backward<T>(dx.data<T>(), want_dw ? dw.data<T>() : nullptr, g.data<T>(), xc.data<T>(),
                              wc.defined() ? wc.data<T>() : nullptr, rstd.data<T>(), N, C);
  });
  return {detail::as_dtype(dx, x.dtype()), want_dw ? detail::as_dtype(dw, weight.dtype()) : Tensor(), Tensor()};
}

// layer_norm's CPU forward for a contiguous bf16/f16 x: the f32 copies of x and of the output exist one slab of
// rows at a time (at most kNarrowSlabElements floats each) instead of at full size, since mixed precision keeps
// activations narrow to halve them and full-size f32 temporaries would give that back at the forward's peak.
// Each row is normalised by the same kernel as on the widened path, so the results are the same bits.
constexpr std::int64_t kNarrowSlabElements = std::int64_t{1} << 19;

void layer_norm_forward_narrow(const Tensor& x, const Tensor& wc, const Tensor& bc, double eps, Tensor& out,
                               Tensor& mean, Tensor& rstd) {
  const std::int64_t C = x.size(-1), N = x.numel() / C;
  const std::int64_t slab = std::min(N, std::max<std::int64_t>(1, kNarrowSlabElements / C));
  const Tensor x2 = x.detach().reshape({N, C}), out2 = out.reshape({N, C});
  const Tensor xs = Tensor::empty({slab, C}, DType::f32), ys = Tensor::empty({slab, C}, DType::f32);
  for (std::int64_t r0 = 0; r0 < N; r0 += slab) {
    const std::int64_t r = std::min(slab, N - r0);
    xs.narrow(0, 0, r).copy_(x2.narrow(0, r0, r));
    cpu::layer_norm_forward<float>(ys.data<float>(), mean.data<float>() + r0, rstd.data<float>() + r0, xs.data<float>(),
                                   wc.defined() ? wc.data<float>() : nullptr, bc.defined() ? bc.data<float>() : nullptr,
                                   r, C, eps);
    out2.narrow(0, r0, r).copy_(ys.narrow(0, 0, r));
  }
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  check_input(op, x);
  check_affine(op, "weight", weight, x);
  check_affine(op, "bias", bias, x);
  const std::int64_t C = x.size(-1), N = x.numel() / C;
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  Tensor out, mean, rstd;
  if (x.device().is_cuda()) {
    check_cuda_operands(op, x, weight, bias);
    const Device dev = x.device();
    out = Tensor::empty(x.shape(), x.dtype(), dev);
    mean = Tensor::empty(stat_shape, DType::f32, dev);
    rstd = Tensor::empty(stat_shape, DType::f32, dev);
    cuda::layer_norm_forward(out.data_ptr(), mean.data<float>(), rstd.data<float>(), x.data_ptr(),
                             weight.defined() ? weight.data_ptr() : nullptr, bias.defined() ? bias.data_ptr() : nullptr,
                             x.dtype(), N, C, eps, dev.index);
  } else {
    detail::check_cpu(op, x);
    const Tensor wc = weight.defined() ? detail::compute_input(weight) : Tensor();
    const Tensor bc = bias.defined() ? detail::compute_input(bias) : Tensor();
    if ((x.dtype() == DType::bf16 || x.dtype() == DType::f16) && x.is_contiguous() && x.numel() > 0) {
      out = Tensor::empty(x.shape(), x.dtype());
      mean = Tensor::empty(stat_shape, DType::f32);
      rstd = Tensor::empty(stat_shape, DType::f32);
      layer_norm_forward_narrow(x, wc, bc, eps, out, mean, rstd);
    } else {
      const Tensor xc = detail::compute_input(x);
      Tensor y = Tensor::empty(xc.shape(), xc.dtype());
      mean = Tensor::empty(stat_shape, xc.dtype());
      rstd = Tensor::empty(stat_shape, xc.dtype());
      detail::dispatch_compute(op, xc.dtype(), [&](auto zero) {
        using T = decltype(zero);
        cpu::layer_norm_forward<T>(y.data<T>(), mean.data<T>(), rstd.data<T>(), xc.data<T>(),
                                   wc.defined() ? wc.data<T>() : nullptr, bc.defined() ? bc.data<T>() : nullptr, N, C,
                                   eps);
      });
      out = detail::as_dtype(y, x.dtype());
    }
  }
  const std::vector<Tensor> inputs = defined_only({x, weight, bias});
  if (autograd::needs_grad(inputs)) {
    const bool want_dw = weight.defined() && weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    SavedTensor sx(x), sw(weight), smean(mean), srstd(rstd);
    autograd::record(op, inputs, {out},
                     [sx, sw, smean, srstd, want_dw, want_db, has_w = weight.defined(), has_b = bias.defined(),
                      bias_dtype = bias.defined() ? bias.dtype() : x.dtype()](const std::vector<Tensor>& g) {
                       NormGrads r = layer_norm_backward(g[0], sx.unpack(), sw.unpack(), smean.unpack(),
                                                         srstd.unpack(), want_dw, want_db);
                       std::vector<Tensor> grads{r.dx};
                       if (has_w) grads.push_back(r.dw);
                       if (has_b) grads.push_back(r.db.defined() ? detail::as_dtype(r.db, bias_dtype) : Tensor());
                       return grads;
                     });
  }
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  check_input(op, x);
  check_affine(op, "weight", weight, x);
  const std::int64_t C = x.size(-1), N = x.numel() / C;
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  Tensor out, rstd;
  if (x.device().is_cuda()) {
    check_cuda_operands(op, x, weight, Tensor());
    const Device dev = x.device();
    out = Tensor::empty(x.shape(), x.dtype(), dev);
    rstd = Tensor::empty(stat_shape, DType::f32, dev);
    cuda::rms_norm_forward(out.data_ptr(), rstd.data<float>(), x.data_ptr(),
                           weight.defined() ? weight.data_ptr() : nullptr, x.dtype(), N, C, eps, dev.index);
  } else {
    detail::check_cpu(op, x);
    const Tensor xc = detail::compute_input(x);
    const Tensor wc = weight.defined() ? detail::compute_input(weight) : Tensor();
    Tensor y = Tensor::empty(xc.shape(), xc.dtype());
    rstd = Tensor::empty(stat_shape, xc.dtype());
    detail::dispatch_compute(op, xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::rms_norm_forward<T>(y.data<T>(), rstd.data<T>(), xc.data<T>(), wc.defined() ? wc.data<T>() : nullptr, N,
                               C, eps);
    });
    out = detail::as_dtype(y, x.dtype());
  }
  const std::vector<Tensor> inputs = defined_only({x, weight});
  if (autograd::needs_grad(inputs)) {
    const bool want_dw = weight.defined() && weight.requires_grad();
    SavedTensor sx(x), sw(weight), srstd(rstd);
    autograd::record(op, inputs, {out},
                     [sx, sw, srstd, want_dw, has_w = weight.defined()](const std::vector<Tensor>& g) {
                       NormGrads r = rms_norm_backward(g[0], sx.unpack(), sw.unpack(), srstd.unpack(), want_dw);
                       std::vector<Tensor> grads{r.dx};
                       if (has_w) grads.push_back(r.dw);
                       return grads;
                     });
  }
  return out;
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, bool update_running) {
  const char* op = "batch_norm";
  detail::check_floating(op, x);
  MT_CHECK(x.dim() == 4, op, "expects x [B, C, H, W], got {}", shape_str(x.shape()));
  const std::int64_t B = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  for (const auto& [what, p] : {std::pair<const char*, const Tensor&>{"weight", weight},
                                {"bias", bias}, {"running_mean", running_mean}, {"running_var", running_var}}) {
    if (!p.defined()) continue;
    detail::check_same_device(op, "input", x, what, p);
    MT_CHECK(p.dim() == 1 && p.size(0) == C, op, "{} {} does not match the channels of input {}", what,
             shape_str(p.shape()), shape_str(x.shape()));
  }
  MT_CHECK(training || (running_mean.defined() && running_var.defined()), op, "eval mode needs running statistics");
  MT_CHECK(!training || B * HW > 1, op, "training needs more than one value per channel, got input {}",
           shape_str(x.shape()));
  const Shape per_channel{1, C, 1, 1};
  if (!x.device().is_cuda()) {
    detail::check_cpu(op, x);
    const Tensor w = weight.defined() ? weight.reshape(per_channel) : Tensor();
    const Tensor b = bias.defined() ? bias.reshape(per_channel) : Tensor();
    auto affine = [&](Tensor y) {
      if (w.defined()) y = y * w;
      return b.defined() ? y + b : y;
    };
    if (!training) {
      const Tensor invstd = ops::rsqrt(running_var.reshape(per_channel) + eps);
      return affine((x - running_mean.reshape(per_channel)) * invstd);
    }
    const Tensor mean = ops::mean(x, {0, 2, 3}, true);       // (1,C,1,1)
    const Tensor xc = x - mean;                              // (B,C,H,W)
    const Tensor var = ops::mean(xc * xc, {0, 2, 3}, true);  // (1,C,1,1), biased
    Tensor y = affine(xc * ops::rsqrt(var + eps));
    if (update_running && running_mean.defined()) {
      autograd::NoGradGuard no_grad;
      const double n = static_cast<double>(B * HW), unbias = n / (n - 1.0);
      Tensor rm = running_mean, rv = running_var;  // handles: copy_ writes the caller's storage
      rm.copy_(running_mean * (1.0 - momentum) + mean.detach().reshape({C}) * momentum);
      rv.copy_(running_var * (1.0 - momentum) + var.detach().reshape({C}) * (momentum * unbias));
    }
    return y;
  }
  // CUDA: one dtype (f32, bf16 or f16) for every operand, contiguous.
  auto operand = [&](const char* what, const Tensor& t) {
    if (!t.defined()) return Tensor();
    detail::check_cuda_same_dtype(op, what, t, "input", x);
    const Tensor c = t.detach().contiguous();
    detail::check_cuda_data(op, what, c);
    return c;
  };
  const Tensor xc = operand("input", x), wc = operand("weight", weight), bc = operand("bias", bias);
  const bool update = training && update_running && running_mean.defined();
  for (const auto& [what, p] : {std::pair<const char*, const Tensor&>{"running_mean", running_mean},
                                {"running_var", running_var}}) {
    if (!p.defined() || (training && !update)) continue;
    detail::check_cuda_same_dtype(op, what, p, "input", x);
    MT_CHECK(p.is_contiguous(), op, "{} must be contiguous on {}", what, p.device().str());
  }
  const Device dev = x.device();
  const auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev);
  Tensor save_mean = Tensor::empty({C}, DType::f32, dev), save_invstd = Tensor::empty({C}, DType::f32, dev);
  cuda::batch_norm_forward(y.data_ptr(), save_mean.data<float>(), save_invstd.data<float>(),
                           training && !update ? nullptr : running_mean.data_ptr(),
                           training && !update ? nullptr : running_var.data_ptr(), xc.data_ptr(), ptr(wc), ptr(bc),
                           x.dtype(), B, C, HW, training, momentum, eps, dev.index);
  const std::vector<Tensor> inputs = defined_only({x, weight, bias});
  if (autograd::needs_grad(inputs)) {
    const bool want_dw = weight.defined() && weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    SavedTensor sx(xc), sw(wc), smean(save_mean), sinv(save_invstd);
    autograd::record(op, inputs, {y},
                     [sx, sw, smean, sinv, want_dw, want_db, training, B, C, HW, has_w = weight.defined(),
                      has_b = bias.defined()](const std::vector<Tensor>& g) {
                       const Tensor xs = sx.unpack(), ws = sw.unpack();
                       const Tensor dout = g[0].contiguous();
                       check_cuda_grad("batch_norm_backward", dout, xs);
                       const Device d = xs.device();
                       Tensor dx = Tensor::empty(xs.shape(), xs.dtype(), d);
                       Tensor dw = want_dw ? Tensor::empty({C}, xs.dtype(), d) : Tensor();
                       Tensor db = want_db ? Tensor::empty({C}, xs.dtype(), d) : Tensor();
                       cuda::batch_norm_backward(dx.data_ptr(), want_dw ? dw.data_ptr() : nullptr,
                                                 want_db ? db.data_ptr() : nullptr, dout.data_ptr(), xs.data_ptr(),
                                                 ws.defined() ? ws.data_ptr() : nullptr, smean.unpack().data<float>(),
                                                 sinv.unpack().data<float>(), xs.dtype(), B, C, HW, training,
                                                 d.index);
                       std::vector<Tensor> grads{dx};
                       if (has_w) grads.push_back(dw);
                       if (has_b) grads.push_back(db);
                       return grads;
                     });
  }
  return y;
}

}  // namespace memtrain::ops
