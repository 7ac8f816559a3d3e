// Selection and comparison: where, masked_fill, gt, lt, eq. where moves elements without arithmetic, so
// its kernel copies raw element bits (any dtype, bf16/fp8 stay exact); comparisons compute in the
// compute dtype (floats) or the integer type itself and write booleans as bytes 0/1. Tensors on a CUDA
// device go to the kernels of memtrain/cuda/elementwise.h, which follow the same rules.
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/elementwise.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "ops/elementwise_common.h"

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

template <typename U>
void where_typed(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  const Shape& shape = out.shape();
  const Shape cs = detail::broadcast_strides(cond, shape), as = detail::broadcast_strides(a, shape),
              bs = detail::broadcast_strides(b, shape);
  const auto* c = static_cast<const std::uint8_t*>(cond.data_ptr());
  const U* pa = static_cast<const U*>(a.data_ptr());
  const U* pb = static_cast<const U*>(b.data_ptr());
  U* po = static_cast<U*>(out.data_ptr());
  std::int64_t pos = 0;
  cpu::for_each_run<3>(shape, {&cs, &as, &bs}, [&](auto off, std::int64_t n, auto inner) {
    for (std::int64_t j = 0; j < n; ++j) {
      // Any nonzero byte is true (the bool storage rule of cpu/convert.h).
      po[pos + j] = c[off[0] + j * inner[0]] != 0 ? pa[off[1] + j * inner[1]] : pb[off[2] + j * inner[2]];
    }
    pos += n;
  });
}

// Operands of a CUDA comparison: f32/f64/f16/bf16, integers and bool as stored; fp8 widened to f32 first
// (exact, as the CPU's to_compute).
Tensor cuda_comparable(const Tensor& t) {
  return is_floating(t.dtype()) && !detail::cuda_native_float(t.dtype()) ? t.detach().to(DType::f32) : t.detach();
}

// out = cond ? a : b, broadcast; not recorded.
Tensor where_kernel(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_boolean(op, cond, "the condition");
  detail::check_same(op, a, b);
  const Shape shape = detail::broadcast_shapes(op, detail::broadcast_shapes(op, cond.shape(), a.shape()), b.shape());
  if (a.device().is_cuda()) {
    MT_CHECK(cond.device() == a.device(), op, "the condition {} is on {} but the values {} are on {}",
             shape_str(cond.shape()), cond.device().str(), shape_str(a.shape()), a.device().str());
    Tensor out = Tensor::empty(shape, a.dtype(), a.device());
    const Shape cs = detail::broadcast_strides(cond, shape), as = detail::broadcast_strides(a, shape),
                bs = detail::broadcast_strides(b, shape);
    cuda::where(out.data_ptr(), cond.data_ptr(), cs.data(), a.data_ptr(), as.data(), b.data_ptr(), bs.data(),
                shape.data(), static_cast<int>(shape.size()), a.element_size(), a.device().index);
    return out;
  }
  detail::check_cpu(op, a);
  detail::check_cpu(op, cond);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  switch (a.element_size()) {
    case 1: where_typed<std::uint8_t>(cond, a, b, out); break;
    case 2: where_typed<std::uint16_t>(cond, a, b, out); break;
    case 4: where_typed<std::uint32_t>(cond, a, b, out); break;
    case 8: where_typed<std::uint64_t>(cond, a, b, out); break;
    default: MT_CHECK(false, op, "unsupported element size {}", a.element_size());
  }
  return out;
}

// Calls f(T{}) with the type comparisons on `t` run in: float/double for floats (after to_compute),
// the integer type itself for integers, uint8_t for bool.
template <typename F>
void dispatch_compare(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::i8: return f(std::int8_t{});
    case DType::u8: return f(std::uint8_t{});
    case DType::i32: return f(std::int32_t{});
    case DType::i64: return f(std::int64_t{});
    case DType::boolean: return f(std::uint8_t{});
    default: MT_CHECK(false, op, "no comparison kernel for dtype {}", dtype_name(t));
  }
}

Tensor comparable(const Tensor& t) { return is_floating(t.dtype()) ? detail::to_compute(t) : t; }

// out[i] = pred(a[i], s) as bool; a numeric (not bool).
template <typename P>
Tensor compare_scalar(const char* op, cuda::CompareOp cuda_op, const Tensor& a, double s, P pred) {
  detail::check_defined(op, a);
  MT_CHECK(a.dtype() != DType::boolean, op, "needs a numeric tensor, got {} bool", shape_str(a.shape()));
  if (a.device().is_cuda()) {
    const Tensor x = cuda_comparable(a);
    Tensor out = Tensor::empty(x.shape(), DType::boolean, x.device());
    cuda::compare_scalar(cuda_op, out.data_ptr(), x.data_ptr(), x.strides().data(), x.shape().data(),
                         static_cast<int>(x.dim()), x.dtype(), s, x.device().index);
    return out;
  }
  detail::check_cpu(op, a);
  const Tensor x = comparable(a);
  Tensor out = Tensor::empty(x.shape(), DType::boolean);
  dispatch_compare(op, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    // Integers compare as double: exact below 2^53, and a fractional s compares as a real number should.
    cpu::map_unary<T, std::uint8_t>(x, out, [&](T v) { return static_cast<std::uint8_t>(pred(static_cast<double>(v), s)); });
  });
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
  return compare_scalar("gt", cuda::CompareOp::gt, a, s, [](double x, double y) { return x > y; });
}

Tensor lt(const Tensor& a, double s) {
  return compare_scalar("lt", cuda::CompareOp::lt, a, s, [](double x, double y) { return x < y; });
}

Tensor eq(const Tensor& a, const Tensor& b) {
  detail::check_same("eq", a, b);
  const Shape shape = detail::broadcast_shapes("eq", a.shape(), b.shape());
  if (a.device().is_cuda()) {
    const Tensor x = cuda_comparable(a), z = cuda_comparable(b);
    Tensor out = Tensor::empty(shape, DType::boolean, a.device());
    const Shape xs = detail::broadcast_strides(x, shape), zs = detail::broadcast_strides(z, shape);
    cuda::eq(out.data_ptr(), x.data_ptr(), xs.data(), z.data_ptr(), zs.data(), shape.data(),
             static_cast<int>(shape.size()), x.dtype(), a.device().index);
    return out;
  }
  detail::check_cpu("eq", a);
  const Tensor x = comparable(a), z = comparable(b);
  Tensor out = Tensor::empty(shape, DType::boolean);
  const bool is_bool = a.dtype() == DType::boolean;
  dispatch_compare("eq", x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::map_binary<T, std::uint8_t>(x.data<T>(), detail::broadcast_strides(x, shape), z.data<T>(),
                                     detail::broadcast_strides(z, shape), out.data<std::uint8_t>(), shape,
                                     [is_bool](T p, T q) {
                                       // Bools: any nonzero byte is true, so compare truth, not bytes.
                                       if (is_bool) return static_cast<std::uint8_t>((p != 0) == (q != 0));
                                       return static_cast<std::uint8_t>(p == q);
                                     });
  });
  return out;
}

}  // namespace memtrain::ops
