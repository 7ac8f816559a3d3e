// cross_entropy: fused log-softmax + negative log-likelihood. The forward saves the logits, the targets
// and one log-sum-exp per row ([N], not the [N, V] probabilities); the backward op rebuilds the softmax
// row by row. mean divides by the number of non-ignored targets (NaN when every target is ignored, as in
// PyTorch); per-row losses are summed in double.
#include "cpu/cross_entropy.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"

#include <limits>

namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

// dlogits from the loss gradient g (scalar for mean/sum, [N] for none).
Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              Reduction reduction, std::int64_t ignore_index, std::int64_t count) {
  const Tensor x = detail::compute_input(logits), gc = detail::compute_input(g);
  const std::int64_t N = x.size(0), V = x.size(1);
  Tensor dx = Tensor::empty(x.shape(), x.dtype());
  detail::dispatch_compute("cross_entropy_backward", x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T scale = reduction == Reduction::none ? T(0) : gc.data<T>()[0];
    if (reduction == Reduction::mean) scale /= static_cast<T>(count);
    const T* dloss = reduction == Reduction::none ? gc.data<T>() : &scale;
    const std::int64_t stride = reduction == Reduction::none ? 1 : 0;
    detail::dispatch_index(targets.dtype(), [&](auto izero) {
      using I = decltype(izero);
      cpu::cross_entropy_backward<T, I>(dx.data<T>(), dloss, stride, x.data<T>(), lse.data<T>(), targets.data<I>(),
                                        N, V, ignore_index);
    });
  });
  return detail::as_dtype(dx, logits.dtype());
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction, std::int64_t ignore_index) {
  const char* op = "cross_entropy";
  detail::check_floating(op, logits);
  detail::check_cpu(op, logits);
  detail::check_index(op, "targets", targets);
  MT_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0), op,
           "expects logits [N, V] and targets [N], got {} and {}", shape_str(logits.shape()),
           shape_str(targets.shape()));
  MT_CHECK(logits.size(1) > 0, op, "logits {} have no classes", shape_str(logits.shape()));
  const std::int64_t N = logits.size(0), V = logits.size(1);
  const Tensor x = detail::compute_input(logits);
  const Tensor t = targets.is_contiguous() ? targets.detach() : targets.detach().contiguous();
  Tensor losses = Tensor::empty({N}, x.dtype()), lse = Tensor::empty({N}, x.dtype());
  std::int64_t count = 0;
  double total = 0;
  detail::dispatch_index(t.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = t.data<I>();
    detail::check_index_range(op, "target", tp, N, V, true, ignore_index, targets.shape());
    for (std::int64_t i = 0; i < N; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore_index;
    detail::dispatch_compute(op, x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::cross_entropy_forward<T, I>(losses.data<T>(), lse.data<T>(), x.data<T>(), tp, N, V, ignore_index);
      for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(losses.data<T>()[i]);
    });
  });
  Tensor out;
  if (reduction == Reduction::none) {
    out = detail::as_dtype(losses, logits.dtype());
  } else {
    const double v = reduction == Reduction::sum ? total
                     : count > 0                 ? total / static_cast<double>(count)
                                                 : std::numeric_limits<double>::quiet_NaN();
    out = full({}, v, logits.dtype());
  }
  if (autograd::needs_grad({&logits})) {
    SavedTensor sx(logits), st(t), slse(lse);
    autograd::record(op, {logits}, {out},
                     [sx, st, slse, reduction, ignore_index, count](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{cross_entropy_backward(g[0], sx.unpack(), st.unpack(), slse.unpack(),
                                                                         reduction, ignore_index, count)};
                     });
  }
  return out;
}

}  // namespace memtrain::ops
