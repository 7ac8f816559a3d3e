// Front-end scaffolding shared by the elementwise ops: check the operands once, allocate the result on their
// device in their dtype, and call that device's backend with the op's name (src/core/backend.h: unary,
// binary; the CPU maps are in src/cpu/elementwise.cpp). Private to binary.cpp and unary.cpp, which write their
// ops in the names brought into memtrain::ops at the end.
#pragma once

#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "ops/op_utils.h"

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

}  // namespace memtrain::ops::detail

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using detail::binary_kernel;
using detail::unary_kernel;
using BOp = detail::BinaryOp;
using UOp = detail::UnaryOp;

}  // namespace memtrain::ops
