// Front-end scaffolding shared by the elementwise ops: check the operands once, allocate the result on their
// device in their dtype, and call that device's backend with the op's name (src/core/backend.h: unary,
// binary; the CPU maps are in src/cpu/elementwise.cpp). Private to binary.cpp and unary.cpp, which write their
// ops in the names brought into memtrain::ops at the end.
#pragma once

#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/dispatch_modes.h"
#include "ops/op_utils.h"

#include <optional>
#include <vector>

namespace memtrain::ops::detail {

using UnaryOp = ::memtrain::detail::Backend::UnaryOp;
using BinaryOp = ::memtrain::detail::Backend::BinaryOp;

// y = op(a) elementwise, in a's dtype on a's device. Not recorded by autograd.
inline Tensor unary_kernel(const char* op, const Tensor& a, UnaryOp k, double p0 = 0.0, double p1 = 0.0) {
  check_floating(op, a);
  Tensor y = Tensor::empty(a.shape(), a.dtype(), a.device());
  ::memtrain::detail::backend_for(a.device()).unary(y, a.detach(), k, p0, p1);
  return y;
}

// out = op(a, b) with broadcasting; a, b same dtype and device (checked). Not recorded by autograd.
inline Tensor binary_kernel(const char* op, const Tensor& a, const Tensor& b, BinaryOp k, double p0 = 0.0,
                            double p1 = 0.0) {
  check_same(op, a, b);
  check_floating(op, a);
  const Shape shape = broadcast_shapes(op, a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  ::memtrain::detail::backend_for(a.device()).binary(out, a.detach(), b.detach(), k, p0, p1);
  return out;
}

// The operands of a tensor-tensor arithmetic op (add, sub, mul, div) of two dtypes, as the current CastMode
// promotes them (amp::Autocast: a pair of its compute dtype and f32 runs in the compute dtype, the f32 operand
// cast by a recorded cast, so its gradient comes back in f32); nullopt when the dtypes agree. Any other mixed
// pair is refused, naming the fix.
inline std::optional<std::vector<Tensor>> promote_operands(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, a);
  check_defined(op, b);
  if (a.dtype() == b.dtype()) return std::nullopt;
  const bool casting = current_cast_mode() != nullptr;
  if (casting) {
    if (auto promoted = cast_mode_promote(a, b)) {
      // The op runs again on these: operands of two dtypes would come back here.
      MT_CHECK(promoted->size() == 2 && (*promoted)[0].dtype() == (*promoted)[1].dtype(), op,
               "the CastMode's promotion of {} and {} did not give one dtype", dtype_name(a.dtype()),
               dtype_name(b.dtype()));
      return promoted;
    }
  }
  MT_CHECK(false, op, "dtype mismatch: {} {} vs {} {} ({})", shape_str(a.shape()), dtype_name(a.dtype()),
           shape_str(b.shape()), dtype_name(b.dtype()),
           casting ? "amp::Autocast promotes only a pair of its compute dtype and f32: cast one operand with "
                     ".to(DType::...)"
                   : "outside amp::Autocast mixed dtypes are not promoted: cast one operand with .to(DType::...) "
                     "or run under amp::Autocast");
  return std::nullopt;
}

}  // namespace memtrain::ops::detail

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using detail::binary_kernel;
using detail::promote_operands;
using detail::unary_kernel;
using BOp = detail::BinaryOp;
using UOp = detail::UnaryOp;

}  // namespace memtrain::ops
