// cross_entropy: fused log-softmax + negative log-likelihood. The forward saves the logits, the targets
// and one log-sum-exp per row ([N], not the [N, V] probabilities); the backward op rebuilds the softmax
// row by row. mean divides by the number of non-ignored targets (NaN when every target is ignored, as in
// PyTorch); per-row losses are summed in double.
// Kernels: the device's backend (src/core/backend.h; src/cpu/cross_entropy.cpp, src/cuda/cuda_nn_backend.cpp),
// which range-checks and counts the targets where their data is (CUDA: on a host copy).
#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/nn.h"
#include "ops/nn_common.h"


namespace memtrain::ops {

using autograd::SavedTensor;

namespace {

// dlogits from the loss gradient g (scalar for mean/sum, [N] for none).
Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              Reduction reduction, std::int64_t ignore_index, std::int64_t count) {
  detail::check_same_device("cross_entropy_backward", "logits", logits, "loss gradient", g);
  const Tensor dx = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  ::memtrain::detail::backend_for(logits.device())
      .cross_entropy_backward(dx, g, logits, targets, lse, ignore_index, reduction == Reduction::none,
                              reduction == Reduction::mean ? count : 1);
  return dx;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction, std::int64_t ignore_index) {
  const char* op = "cross_entropy";
  if (auto c = detail::cast_mode_to_f32(logits)) return cross_entropy((*c)[0], targets, reduction, ignore_index);
  detail::check_floating(op, logits);
  detail::check_index(op, "targets", targets);
  detail::check_same_device(op, "logits", logits, "targets", targets);
  MT_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0), op,
           "expects logits [N, V] and targets [N], got {} and {}", shape_str(logits.shape()),
           shape_str(targets.shape()));
  MT_CHECK(logits.size(1) > 0, op, "logits {} have no classes", shape_str(logits.shape()));
  const std::int64_t N = logits.size(0);
  const auto& backend = ::memtrain::detail::backend_for(logits.device());
  const Tensor t = targets.detach();
  const Tensor out = reduction == Reduction::none ? Tensor::empty({N}, logits.dtype(), logits.device())
                                                  : Tensor::empty({}, logits.dtype(), logits.device());
  const Tensor lse = Tensor::empty({N}, backend.loss_stats_dtype(logits.dtype()), logits.device());
  const std::int64_t count = backend.cross_entropy_forward(out, lse, logits, t, ignore_index, reduction == Reduction::mean);
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
