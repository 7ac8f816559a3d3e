// Front-end scaffolding shared by the elementwise ops: run a CPU map in the compute dtype and give the
// result back in the input's dtype.
#pragma once

#include "cpu/map.h"
#include "ops/op_utils.h"

namespace memtrain::ops::detail {

// y = f(x) elementwise; f is a generic lambda called with float or double. Not recorded by autograd.
template <typename F>
Tensor unary_kernel(const char* op, const Tensor& a, F f) {
  check_floating(op, a);
  check_cpu(op, a);
  const Tensor x = to_compute(a);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  dispatch_compute(op, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::map_unary<T>(x, y, [&](T v) { return static_cast<T>(f(v)); });
  });
  return y.dtype() == a.dtype() ? y : y.to(a.dtype());
}

// out = f(a, b) with broadcasting; a, b same dtype (checked). Not recorded by autograd.
template <typename F>
Tensor binary_kernel(const char* op, const Tensor& a, const Tensor& b, F f) {
  check_same(op, a, b);
  check_floating(op, a);
  check_cpu(op, a);
  const Shape shape = broadcast_shapes(op, a.shape(), b.shape());
  const Tensor x = to_compute(a), z = to_compute(b);
  Tensor out = Tensor::empty(shape, x.dtype());
  dispatch_compute(op, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::map_binary<T>(x.data<T>(), broadcast_strides(x, shape), z.data<T>(), broadcast_strides(z, shape),
                       out.data<T>(), shape, [&](T p, T q) { return static_cast<T>(f(p, q)); });
  });
  return out.dtype() == a.dtype() ? out : out.to(a.dtype());
}

}  // namespace memtrain::ops::detail
