// Selection and comparison: where, masked_fill, gt, lt, eq. where moves elements without arithmetic, so
// its kernel copies raw element bits (any dtype, bf16/fp8 stay exact); comparisons compute in the
// compute dtype (floats) or the integer type itself and write booleans as bytes 0/1. The kernels are the
// backend's (src/core/backend.h: where, compare_scalar, eq; CPU in src/cpu/select.cpp).
#include "core/backend.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "ops/op_utils.h"

#include <cstdint>

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;

namespace {

void check_boolean(const char* op, const Tensor& t, const char* what) {
  detail::check_defined(op, t);
  MT_CHECK(t.dtype() == DType::boolean, op, "{} must be a bool tensor, got {} {}", what, shape_str(t.shape()),
           dtype_name(t.dtype()));
}

// out = cond ? a : b, broadcast; not recorded.
Tensor where_kernel(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_boolean(op, cond, "the condition");
  detail::check_same(op, a, b);
  const Shape shape = detail::broadcast_shapes(op, detail::broadcast_shapes(op, cond.shape(), a.shape()), b.shape());
  MT_CHECK(cond.device() == a.device(), op, "the condition {} is on {} but the values {} are on {}",
           shape_str(cond.shape()), cond.device().str(), shape_str(a.shape()), a.device().str());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  ::memtrain::detail::backend_for(a.device()).where(out, cond.detach(), a.detach(), b.detach());
  return out;
}

using CompareOp = ::memtrain::detail::Backend::CompareOp;

// out[i] = a[i] op s as bool; a numeric (not bool).
Tensor compare_scalar(const char* op, CompareOp cmp, const Tensor& a, double s) {
  detail::check_defined(op, a);
  MT_CHECK(a.dtype() != DType::boolean, op, "needs a numeric tensor, got {} bool", shape_str(a.shape()));
  Tensor out = Tensor::empty(a.shape(), DType::boolean, a.device());
  ::memtrain::detail::backend_for(a.device()).compare_scalar(out, a.detach(), cmp, s);
  return out;
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = where_kernel("where", cond, a, b);
  if (needs_grad({&a, &b})) {
    record("where", {a, b}, {out},
           [c = SavedTensor(cond), sa = a.shape(), sb = b.shape(), ga = a.requires_grad(),
            gb = b.requires_grad()](const std::vector<Tensor>& g) {
             const Tensor mask = c.unpack();
             const Tensor zero = zeros({}, g[0].dtype(), g[0].device());
             return std::vector<Tensor>{ga ? sum_to(where(mask, g[0], zero), sa) : Tensor(),
                                        gb ? sum_to(where(mask, zero, g[0]), sb) : Tensor()};
           });
  }
  return out;
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  detail::check_defined("masked_fill", a);
  check_boolean("masked_fill", mask, "the mask");
  const Shape shape = detail::broadcast_shapes("masked_fill", a.shape(), mask.shape());
  MT_CHECK(shape == a.shape(), "masked_fill", "mask {} does not broadcast to the input's shape {}",
           shape_str(mask.shape()), shape_str(a.shape()));
  const Tensor fill = full({}, value, a.dtype(), a.device());
  Tensor out = where_kernel("masked_fill", mask, fill, a);
  if (needs_grad({&a})) {
    record("masked_fill", {a}, {out}, [m = SavedTensor(mask)](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{where(m.unpack(), zeros({}, g[0].dtype(), g[0].device()), g[0])};
    });
  }
  return out;
}

Tensor gt(const Tensor& a, double s) {
  return compare_scalar("gt", CompareOp::gt, a, s);
}

Tensor lt(const Tensor& a, double s) {
  return compare_scalar("lt", CompareOp::lt, a, s);
}

Tensor eq(const Tensor& a, const Tensor& b) {
  detail::check_same("eq", a, b);
  const Shape shape = detail::broadcast_shapes("eq", a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, DType::boolean, a.device());
  ::memtrain::detail::backend_for(a.device()).eq(out, a.detach(), b.detach());
  return out;
}

}  // namespace memtrain::ops
