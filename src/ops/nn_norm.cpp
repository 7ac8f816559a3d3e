// layer_norm and rms_norm over the last dim. The forward saves x, the affine weight and the per-row
// statistics (layer_norm: mean, rstd; rms_norm: rstd), not the normalised output; the backward ops
// recompute x_hat from them. The front-ends check shapes and dtypes, allocate the results on x's device and
// call that device's backend (src/core/backend.h; kernels in src/cpu/norm.cpp and src/cuda/norm.cu), which
// keeps the statistics in its own dtype (CPU: the compute dtype, CUDA: f32).
// batch_norm (NCHW, per channel; the rule of nn::BatchNorm2d): a backend with fused kernels (CUDA) gets the
// batch_norm_forward / batch_norm_backward entries; elsewhere (CPU, meta) the composition of differentiable ops
// the module has always used, whose backward autograd derives.
#include "core/backend.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
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

// The gradient reaching a backward lives where the forward ran.
void check_grad_device(const char* op, const Tensor& dout, const Tensor& x) {
  detail::check_same_device(op, "input", x, "output gradient", dout);
}

// The layer_norm backward op (own kernels). dw/db take the dtypes of weight/bias and are computed only
// when wanted.
NormGrads layer_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, DType bias_dtype,
                              const Tensor& mean, const Tensor& rstd, bool want_dw, bool want_db) {
  check_grad_device("layer_norm_backward", dout, x);
  const std::int64_t C = x.size(-1);
  const Device dev = x.device();
  NormGrads r{Tensor::empty(x.shape(), x.dtype(), dev), want_dw ? Tensor::empty({C}, weight.dtype(), dev) : Tensor(),
              want_db ? Tensor::empty({C}, bias_dtype, dev) : Tensor()};
  ::memtrain::detail::backend_for(dev).layer_norm_backward(r.dx, r.dw, r.db, dout, x, weight, mean, rstd);
  return r;
}

NormGrads rms_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            bool want_dw) {
  check_grad_device("rms_norm_backward", dout, x);
  const std::int64_t C = x.size(-1);
  const Device dev = x.device();
  NormGrads r{Tensor::empty(x.shape(), x.dtype(), dev), want_dw ? Tensor::empty({C}, weight.dtype(), dev) : Tensor(),
              Tensor()};
  ::memtrain::detail::backend_for(dev).rms_norm_backward(r.dx, r.dw, dout, x, weight, rstd);
  return r;
}

// Row statistics [...] in the dtype the backend keeps them in.
Tensor norm_stats(const ::memtrain::detail::Backend& backend, const Tensor& x) {
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  return Tensor::empty(stat_shape, backend.norm_stats_dtype(x.dtype()), x.device());
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  check_input(op, x);
  check_affine(op, "weight", weight, x);
  check_affine(op, "bias", bias, x);
  const auto& backend = ::memtrain::detail::backend_for(x.device());
  const Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor mean = norm_stats(backend, x), rstd = norm_stats(backend, x);
  backend.layer_norm_forward(out, mean, rstd, x, weight, bias, eps);
  const std::vector<Tensor> inputs = defined_only({x, weight, bias});
  if (autograd::needs_grad(inputs)) {
    const bool want_dw = weight.defined() && weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    SavedTensor sx(x), sw(weight), smean(mean), srstd(rstd);
    autograd::record(op, inputs, {out},
                     [sx, sw, smean, srstd, want_dw, want_db, has_w = weight.defined(), has_b = bias.defined(),
                      bias_dtype = bias.defined() ? bias.dtype() : x.dtype()](const std::vector<Tensor>& g) {
                       NormGrads r = layer_norm_backward(g[0], sx.unpack(), sw.unpack(), bias_dtype, smean.unpack(),
                                                         srstd.unpack(), want_dw, want_db);
                       std::vector<Tensor> grads{r.dx};
                       if (has_w) grads.push_back(r.dw);
                       if (has_b) grads.push_back(r.db);
                       return grads;
                     });
  }
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  check_input(op, x);
  check_affine(op, "weight", weight, x);
  const auto& backend = ::memtrain::detail::backend_for(x.device());
  const Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor rstd = norm_stats(backend, x);
  backend.rms_norm_forward(out, rstd, x, weight, eps);
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

namespace {

// y = (x - mean) * (invstd * weight) + bias with the ops' autograd: nn::BatchNorm2d's composition and rounding
// order, which its golden tests against PyTorch pin. Every op runs on x's backend, so meta allocates what the
// CPU does.
Tensor batch_norm_composed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, bool training, double momentum, double eps,
                           bool update_running) {
  const std::int64_t C = x.size(1);
  const Shape per_channel{1, C, 1, 1};
  const Tensor w = weight.defined() ? weight.reshape(per_channel) : Tensor();
  const Tensor b = bias.defined() ? bias.reshape(per_channel) : Tensor();
  // One expression each, so every temporary lives as long as it did in the module's own code.
  auto normalise = [&](const Tensor& centred, const Tensor& invstd) {
    if (w.defined()) return b.defined() ? centred * (invstd * w) + b : centred * (invstd * w);
    return b.defined() ? centred * invstd + b : centred * invstd;
  };
  if (!training) {
    const Tensor invstd = ops::rsqrt(running_var.reshape(per_channel) + eps);  // (1,C,1,1), constants
    return normalise(x - running_mean.reshape(per_channel), invstd);
  }
  const Tensor mean = ops::mean(x, {0, 2, 3}, true);       // (1,C,1,1)
  const Tensor xc = x - mean;                              // (B,C,H,W)
  const Tensor var = ops::mean(xc * xc, {0, 2, 3}, true);  // (1,C,1,1), biased: what normalises the batch
  Tensor y = normalise(xc, ops::rsqrt(var + eps));
  if (update_running && running_mean.defined()) {
    autograd::NoGradGuard no_grad;
    const std::int64_t n = x.size(0) * x.size(2) * x.size(3);  // values per channel
    const double unbias = static_cast<double>(n) / static_cast<double>(n - 1);
    Tensor rm = running_mean, rv = running_var;  // handles: copy_ writes the caller's storage
    rm.copy_(running_mean * (1.0 - momentum) + mean.detach().reshape({C}) * momentum);
    rv.copy_(running_var * (1.0 - momentum) + var.detach().reshape({C}) * (momentum * unbias));
  }
  return y;
}

// The backend's fused kernels: x, weight and bias as contiguous copies (saved for the backward), the statistics
// the output was normalised with saved as f32 [C].
Tensor batch_norm_fused(const ::memtrain::detail::Backend& backend, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, const Tensor& running_mean, const Tensor& running_var, bool training,
                        double momentum, double eps, bool update_running) {
  const std::int64_t C = x.size(1);
  const Tensor xc = ::memtrain::detail::dense(x), wc = ::memtrain::detail::dense(weight);
  const Tensor bc = ::memtrain::detail::dense(bias);
  // In training without an update the running statistics are neither read nor written.
  const bool running = !training || (update_running && running_mean.defined());
  const Device dev = x.device();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev);
  Tensor save_mean = Tensor::empty({C}, DType::f32, dev), save_invstd = Tensor::empty({C}, DType::f32, dev);
  backend.batch_norm_forward(y, save_mean, save_invstd, running ? running_mean : Tensor(),
                             running ? running_var : Tensor(), xc, wc, bc, training, momentum, eps);
  const std::vector<Tensor> inputs = defined_only({x, weight, bias});
  if (autograd::needs_grad(inputs)) {
    const bool want_dw = weight.defined() && weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    SavedTensor sx(xc), sw(wc), smean(save_mean), sinv(save_invstd);
    autograd::record("batch_norm", inputs, {y},
                     [sx, sw, smean, sinv, want_dw, want_db, training, C, has_w = weight.defined(),
                      has_b = bias.defined()](const std::vector<Tensor>& g) {
                       const Tensor xs = sx.unpack();
                       const Tensor dout = g[0].contiguous();
                       check_grad_device("batch_norm_backward", dout, xs);
                       const Device d = xs.device();
                       Tensor dx = Tensor::empty(xs.shape(), xs.dtype(), d);
                       Tensor dw = want_dw ? Tensor::empty({C}, xs.dtype(), d) : Tensor();
                       Tensor db = want_db ? Tensor::empty({C}, xs.dtype(), d) : Tensor();
                       ::memtrain::detail::backend_for(d).batch_norm_backward(dx, dw, db, dout, xs, sw.unpack(),
                                                                              smean.unpack(), sinv.unpack(), training);
                       std::vector<Tensor> grads{dx};
                       if (has_w) grads.push_back(dw);
                       if (has_b) grads.push_back(db);
                       return grads;
                     });
  }
  return y;
}

}  // namespace

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
  const auto& backend = ::memtrain::detail::backend_for(x.device());
  if (!backend.has_batch_norm_kernels())
    return batch_norm_composed(x, weight, bias, running_mean, running_var, training, momentum, eps, update_running);
  return batch_norm_fused(backend, x, weight, bias, running_mean, running_var, training, momentum, eps,
                          update_running);
}

}  // namespace memtrain::ops
