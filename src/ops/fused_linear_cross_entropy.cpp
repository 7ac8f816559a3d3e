// fused_linear_cross_entropy: linear + cross-entropy walked in chunks of rows, so the [N, V] logits are
// never alive at once. The front-end checks the operands once, lets the backend run the chunked forward
// (losses and lse [N]; only lse is kept) and reduces the per-row losses on the host in row order, in double,
// as ops::cross_entropy does; the backward hands the loss gradient to the backend, which recomputes each
// chunk's logits and turns them into dx, dW and db (src/core/backend.h: fused_linear_ce_*).
// Reductions, ignore_index and the mean's count follow ops::cross_entropy exactly.
#include "memtrain/ops/fused_loss.h"

#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "ops/nn_common.h"

#include <limits>
#include <vector>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

constexpr const char* kOp = "fused_linear_cross_entropy";

void check_f32(const char* what, const Tensor& t, const Tensor& x) {
  MT_CHECK(t.dtype() == DType::f32, kOp, "{} must be an f32 tensor, got {} {} on {}", what, dtype_name(t.dtype()),
           shape_str(t.shape()), t.device().str());
  detail::check_same_device(kOp, "x", x, what, t);
}

struct Saved {
  SavedTensor x, weight, bias, targets, lse;
};

// Gradients of x, weight and (when defined) bias from the loss gradient g (scalar for mean/sum, [N] for
// none). Undefined where not wanted.
std::vector<Tensor> fused_backward(const Tensor& g, const Saved& s, Reduction reduction, std::int64_t ignore_index,
                                   std::int64_t count, std::int64_t chunk_rows, bool want_dx, bool want_dw,
                                   bool want_db) {
  const Tensor x = s.x.unpack(), w = s.weight.unpack(), t = s.targets.unpack(), lse = s.lse.unpack();
  const Tensor b = s.bias.defined() ? s.bias.unpack() : Tensor();
  const std::int64_t N = x.size(0), C = x.size(1), V = w.size(0);
  const Device dev = x.device();
  Tensor dloss;  // f32 on x's device: one scale (stride 0) or [N] (stride 1)
  std::int64_t dloss_stride = 0;
  if (reduction == Reduction::none) {
    MT_CHECK(g.dim() == 1 && g.size(0) == N, kOp, "loss gradient {} does not match {} rows", shape_str(g.shape()), N);
    detail::check_same_device(kOp, "x", x, "loss gradient", g);
    dloss = g.detach().to(DType::f32).contiguous();
    dloss_stride = 1;
  } else {
    MT_CHECK(g.numel() == 1, kOp, "loss gradient {} is not a scalar", shape_str(g.shape()));
    // Formed on the host in f32, on every device.
    auto scale = static_cast<float>(g.item());
    if (reduction == Reduction::mean) scale /= static_cast<float>(count);
    dloss = full({1}, static_cast<double>(scale), DType::f32, dev);
  }
  const Tensor dx = want_dx ? Tensor::empty({N, C}, x.dtype(), dev) : Tensor();  // (N, C), every row written
  const Tensor dw = want_dw ? zeros({V, C}, DType::f32, dev) : Tensor();          // (V, C), accumulated
  const Tensor db = want_db ? zeros({V}, DType::f32, dev) : Tensor();             // (V), accumulated
  ::memtrain::detail::backend_for(dev).fused_linear_ce_backward(dx, dw, db, dloss, dloss_stride, x, w, b, t, lse,
                                                                ignore_index, chunk_rows);
  std::vector<Tensor> grads{dx, dw};
  if (s.bias.defined()) grads.push_back(db);
  return grads;
}

}  // namespace

Tensor fused_linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& targets,
                                  Reduction reduction, std::int64_t ignore_index, std::int64_t chunk_rows) {
  detail::check_defined(kOp, x);
  detail::check_defined(kOp, weight);
  detail::check_index(kOp, "targets", targets);
  MT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, kOp,
           "x must be an f32, bf16 or f16 tensor, got {} {} on {}", dtype_name(x.dtype()), shape_str(x.shape()),
           x.device().str());
  check_f32("weight", weight, x);
  if (bias.defined()) check_f32("bias", bias, x);
  detail::check_same_device(kOp, "x", x, "targets", targets);
  MT_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), kOp,
           "expects x [N, C] and weight [V, C], got x {} and weight {}", shape_str(x.shape()),
           shape_str(weight.shape()));
  MT_CHECK(weight.size(0) > 0, kOp, "weight {} has no classes", shape_str(weight.shape()));
  MT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), kOp,
           "bias {} does not match weight {} (expects [V])", shape_str(bias.shape()), shape_str(weight.shape()));
  MT_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0), kOp, "expects targets [N] for x {}, got {}",
           shape_str(x.shape()), shape_str(targets.shape()));
  MT_CHECK(chunk_rows > 0, kOp, "chunk_rows must be positive, got {}", chunk_rows);

  const std::int64_t N = x.size(0);
  const Device dev = x.device();
  const Tensor losses = Tensor::empty({N}, DType::f32, dev), lse = Tensor::empty({N}, DType::f32, dev);  // (N) each
  const std::int64_t count = ::memtrain::detail::backend_for(dev).fused_linear_ce_forward(
      losses, lse, x, weight, bias, targets, ignore_index, chunk_rows);

  Tensor out;
  if (reduction == Reduction::none) {
    out = losses;
  } else {
    const Tensor host = losses.to(Device::cpu());  // no copy on the CPU; zeros from meta
    const float* lp = host.data<float>();
    double total = 0;  // in row order, in double, as cross_entropy sums
    for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(lp[i]);
    const double v = reduction == Reduction::sum ? total
                     : count > 0                 ? total / static_cast<double>(count)
                                                 : std::numeric_limits<double>::quiet_NaN();
    out = full({}, v, DType::f32, dev);
  }

  if (autograd::needs_grad({&x, &weight, &bias})) {
    Saved s{SavedTensor(x), SavedTensor(weight), bias.defined() ? SavedTensor(bias) : SavedTensor(),
            SavedTensor(targets.detach()), SavedTensor(lse)};
    const bool want_dx = x.requires_grad(), want_dw = weight.requires_grad();
    const bool want_db = bias.defined() && bias.requires_grad();
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    autograd::record(kOp, inputs, {out},
                     [s, reduction, ignore_index, count, chunk_rows, want_dx, want_dw,
                      want_db](const std::vector<Tensor>& g) {
                       return fused_backward(g[0], s, reduction, ignore_index, count, chunk_rows, want_dx, want_dw,
                                             want_db);
                     });
  }
  return out;
}

}  // namespace memtrain::ops
