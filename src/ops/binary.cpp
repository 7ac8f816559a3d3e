// Arithmetic with broadcasting: add, sub, mul, div (tensor-tensor and tensor-scalar), neg, in-place add.
// Backward rules sum each gradient back to its input's shape (sum_to undoes the broadcast). Tensor-tensor
// operands of two dtypes go through promote_operands first (amp::Autocast's promotion, or a clear refusal).
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "ops/elementwise_common.h"

namespace memtrain::ops {

Tensor add(const Tensor& a, const Tensor& b) {
  if (auto p = promote_operands("add", a, b)) return add((*p)[0], (*p)[1]);
  Tensor out = binary_kernel("add", a, b, BOp::add);
  if (needs_grad({&a, &b})) {
    record("add", {a, b}, {out}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to(g[0], sa), sum_to(g[0], sb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (auto p = promote_operands("sub", a, b)) return sub((*p)[0], (*p)[1]);
  Tensor out = binary_kernel("sub", a, b, BOp::sub);
  if (needs_grad({&a, &b})) {
    record("sub", {a, b}, {out}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (auto p = promote_operands("mul", a, b)) return mul((*p)[0], (*p)[1]);
  Tensor out = binary_kernel("mul", a, b, BOp::mul);
  if (needs_grad({&a, &b})) {
    // Save only what each gradient needs: dA needs B, dB needs A.
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(a.requires_grad() ? b : Tensor());
    record("mul", {a, b}, {out}, [sa, sb, sha = a.shape(), shb = b.shape()](const std::vector<Tensor>& g) {
      const Tensor av = sa.unpack(), bv = sb.unpack();
      return std::vector<Tensor>{bv.defined() ? sum_to(mul(g[0], bv), sha) : Tensor(),
                                 av.defined() ? sum_to(mul(g[0], av), shb) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (auto p = promote_operands("div", a, b)) return div((*p)[0], (*p)[1]);
  Tensor out = binary_kernel("div", a, b, BOp::div);
  if (needs_grad({&a, &b})) {
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(b);
    record("div", {a, b}, {out}, [sa, sb, sha = a.shape(), shb = b.shape()](const std::vector<Tensor>& g) {
      const Tensor av = sa.unpack(), bv = sb.unpack();
      const Tensor da = sum_to(div(g[0], bv), sha);
      // d(a/b)/db = -a / b^2
      const Tensor db = av.defined() ? sum_to(neg(div(mul(g[0], av), mul(bv, bv))), shb) : Tensor();
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

Tensor add(const Tensor& a, double s) {
  Tensor out = unary_kernel("add", a, UOp::add_scalar, s);
  if (needs_grad({&a})) record("add_scalar", {a}, {out}, [](const std::vector<Tensor>& g) { return g; });
  return out;
}

Tensor sub(const Tensor& a, double s) { return add(a, -s); }

Tensor rsub(double s, const Tensor& a) { return add(neg(a), s); }

Tensor mul(const Tensor& a, double s) {
  Tensor out = unary_kernel("mul", a, UOp::mul_scalar, s);
  if (needs_grad({&a})) {
    record("mul_scalar", {a}, {out}, [s](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], s)}; });
  }
  return out;
}

Tensor div(const Tensor& a, double s) { return mul(a, 1.0 / s); }

Tensor rdiv(double s, const Tensor& a) {
  Tensor out = unary_kernel("rdiv", a, UOp::rdiv_scalar, s);
  if (needs_grad({&a})) {
    SavedTensor sa(a);
    record("rdiv", {a}, {out}, [sa, s](const std::vector<Tensor>& g) {
      const Tensor av = sa.unpack();
      return std::vector<Tensor>{neg(div(mul(g[0], s), mul(av, av)))};  // d(s/a)/da = -s / a^2
    });
  }
  return out;
}

Tensor neg(const Tensor& a) {
  Tensor out = unary_kernel("neg", a, UOp::neg);
  if (needs_grad({&a})) {
    record("neg", {a}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
  }
  return out;
}

Tensor& add_(Tensor& self, const Tensor& other) {
  detail::check_same("add_", self, other);
  const Shape shape = detail::broadcast_shapes("add_", self.shape(), other.shape());
  MT_CHECK(shape == self.shape(), "add_", "cannot add {} into {} in place", shape_str(other.shape()),
           shape_str(self.shape()));
  detail::check_floating("add_", self);
  // In place: each element of self is read and written by one thread. An `other` sharing self's memory
  // would race with those writes, so it is read from a copy.
  const Tensor o = other.shares_storage_with(self) ? other.detach().clone() : other.detach();
  ::memtrain::detail::backend_for(self.device()).binary(self, self.detach(), o, BOp::add, 0.0, 0.0);
  return self;
}

Tensor& mul_(Tensor& self, double s) {
  detail::check_floating("mul_", self);
  ::memtrain::detail::backend_for(self.device()).unary(self, self.detach(), UOp::mul_scalar, s, 0.0);
  return self;
}

Tensor zeros_like(const Tensor& a) { return zeros(a.shape(), a.dtype(), a.device()); }
Tensor ones_like(const Tensor& a) { return ones(a.shape(), a.dtype(), a.device()); }

}  // namespace memtrain::ops
