// mse_loss and l1_loss, composed of differentiable elementwise ops and reductions: every backend that runs
// sub/pow/abs/mean runs them (CPU, CUDA, meta), and autograd gives the backward, to the target as well when
// it requires grad (as in PyTorch). The forward saves what those ops save: the difference (input - target).
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"
#include "ops/op_utils.h"

namespace memtrain::ops {

namespace {

// Both floating, same shape (no broadcasting: a [N] target against an [N, 1] input would silently give an
// [N, N] loss).
void check_loss_operands(const char* op, const Tensor& input, const Tensor& target) {
  detail::check_floating(op, input);
  detail::check_floating(op, target);
  MT_CHECK(input.shape() == target.shape(), op, "input {} and target {} must have the same shape",
           shape_str(input.shape()), shape_str(target.shape()));
}

// One dtype and device, checked after autocast had its say (it casts both to f32), so a mismatch names
// this op rather than the sub inside it.
void check_one_dtype(const char* op, const Tensor& input, const Tensor& target) {
  MT_CHECK(input.dtype() == target.dtype(), op,
           "input {} {} and target {} {} must have one dtype (cast one with .to(), or run under amp::Autocast)",
           shape_str(input.shape()), dtype_name(input.dtype()), shape_str(target.shape()),
           dtype_name(target.dtype()));
  detail::check_same(op, input, target);  // the device
}

Tensor apply_reduction(const Tensor& per_element, Reduction reduction) {
  switch (reduction) {
    case Reduction::mean: return mean(per_element);
    case Reduction::sum: return sum(per_element);
    case Reduction::none: return per_element;
  }
  return per_element;
}

}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "mse_loss";
  check_loss_operands(op, input, target);
  // Losses run in f32 under autocast, as cross_entropy does (and PyTorch's autocast for these two losses).
  if (auto c = detail::cast_mode_to_f32(input, target)) return mse_loss((*c)[0], (*c)[1], reduction);
  check_one_dtype(op, input, target);
  return apply_reduction(pow(sub(input, target), 2.0), reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "l1_loss";
  check_loss_operands(op, input, target);
  if (auto c = detail::cast_mode_to_f32(input, target)) return l1_loss((*c)[0], (*c)[1], reduction);
  check_one_dtype(op, input, target);
  return apply_reduction(abs(sub(input, target)), reduction);
}

}  // namespace memtrain::ops
