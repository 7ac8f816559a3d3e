// Arithmetic with broadcasting: add, sub, mul, div (tensor-tensor and tensor-scalar), neg, in-place add.
// Backward rules sum each gradient back to its input's shape (sum_to undoes the broadcast).
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/elementwise.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "ops/elementwise_common.h"

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using detail::binary_kernel;
using detail::unary_kernel;

namespace {

using detail::CudaBinary;
using detail::CudaUnary;
using BOp = cuda::BinaryOp;
using UOp = cuda::UnaryOp;

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel("add", a, b, CudaBinary{BOp::add}, [](auto x, auto y) { return x + y; });
  if (needs_grad({&a, &b})) {
    record("add", {a, b}, {out}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to(g[0], sa), sum_to(g[0], sb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel("sub", a, b, CudaBinary{BOp::sub}, [](auto x, auto y) { return x - y; });
  if (needs_grad({&a, &b})) {
    record("sub", {a, b}, {out}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel("mul", a, b, CudaBinary{BOp::mul}, [](auto x, auto y) { return x * y; });
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
  Tensor out = binary_kernel("div", a, b, CudaBinary{BOp::div}, [](auto x, auto y) { return x / y; });
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
  Tensor out = unary_kernel("add", a, CudaUnary{UOp::add_scalar, s},
                            [s](auto x) { return x + static_cast<decltype(x)>(s); });
  if (needs_grad({&a})) record("add_scalar", {a}, {out}, [](const std::vector<Tensor>& g) { return g; });
  return out;
}

Tensor sub(const Tensor& a, double s) { return add(a, -s); }

Tensor rsub(double s, const Tensor& a) { return add(neg(a), s); }

Tensor mul(const Tensor& a, double s) {
  Tensor out = unary_kernel("mul", a, CudaUnary{UOp::mul_scalar, s},
                            [s](auto x) { return x * static_cast<decltype(x)>(s); });
  if (needs_grad({&a})) {
    record("mul_scalar", {a}, {out}, [s](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], s)}; });
  }
  return out;
}

Tensor div(const Tensor& a, double s) { return mul(a, 1.0 / s); }

Tensor rdiv(double s, const Tensor& a) {
  Tensor out = unary_kernel("rdiv", a, CudaUnary{UOp::rdiv_scalar, s},
                            [s](auto x) { return static_cast<decltype(x)>(s) / x; });
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
  Tensor out = unary_kernel("neg", a, CudaUnary{UOp::neg}, [](auto x) { return -x; });
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
  if (self.device().is_cuda()) {
    detail::check_floating("add_", self);
    if (!self.is_contiguous() || !detail::cuda_native_float(self.dtype())) {
      return self.copy_(detail::cuda_binary(self.detach(), other.detach(), shape, CudaBinary{BOp::add}));
    }
    // In place: the kernel reads self[i] and writes it from the same thread. An `other` sharing self's
    // memory in another layout would race with those writes, so it is read from a copy.
    const Tensor o = other.shares_storage_with(self) ? other.detach().clone() : other.detach();
    const Shape os = detail::broadcast_strides(o, shape);
    cuda::elementwise_binary(BOp::add, self.data_ptr(), self.data_ptr(), self.strides().data(), o.data_ptr(), os.data(),
                             shape.data(), static_cast<int>(shape.size()), self.dtype(), 0.0, 0.0,
                             self.device().index);
    return self;
  }
  if (self.is_contiguous() && detail::compute_dtype(self.dtype()) == self.dtype()) {
    detail::dispatch_compute("add_", self.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::map_binary<T>(self.data<T>(), self.strides(), other.data<T>(), detail::broadcast_strides(other, shape),
                         self.data<T>(), shape, [](T x, T y) { return x + y; });
    });
    return self;
  }
  self.copy_(binary_kernel("add_", self.detach(), other.detach(), CudaBinary{BOp::add},
                           [](auto x, auto y) { return x + y; }));
  return self;
}

Tensor& mul_(Tensor& self, double s) {
  if (self.device().is_cuda() && self.is_contiguous() && detail::cuda_native_float(self.dtype())) {
    cuda::elementwise_unary(UOp::mul_scalar, self.data_ptr(), self.data_ptr(), self.strides().data(),
                            self.shape().data(), static_cast<int>(self.dim()), self.dtype(), s, 0.0,
                            self.device().index);
    return self;
  }
  self.copy_(unary_kernel("mul_", self.detach(), CudaUnary{UOp::mul_scalar, s},
                          [s](auto x) { return x * static_cast<decltype(x)>(s); }));
  return self;
}

Tensor zeros_like(const Tensor& a) { return zeros(a.shape(), a.dtype(), a.device()); }
Tensor ones_like(const Tensor& a) { return ones(a.shape(), a.dtype(), a.device()); }

}  // namespace memtrain::ops
