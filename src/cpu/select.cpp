// The CPU backend's selection and comparison entries (src/core/backend.h: where, compare_scalar, eq). where
// moves elements without arithmetic, so it copies raw element bits (any dtype; bf16/fp8 stay exact);
// comparisons compute in the compute dtype (floats) or the integer type itself and write bool bytes 0/1.
#include "cpu/cpu_backend.h"
#include "cpu/map.h"
#include "cpu/strided.h"

#include <cstdint>

namespace memtrain::cpu {

namespace {

template <typename U>
void where_typed(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Shape& shape = out.shape();
  const Shape cs = broadcast_strides(cond, shape), as = broadcast_strides(a, shape), bs = broadcast_strides(b, shape);
  const auto* c = static_cast<const std::uint8_t*>(cond.data_ptr());
  const U* pa = static_cast<const U*>(a.data_ptr());
  const U* pb = static_cast<const U*>(b.data_ptr());
  U* po = static_cast<U*>(out.data_ptr());
  std::int64_t pos = 0;
  for_each_run<3>(shape, {&cs, &as, &bs}, [&](auto off, std::int64_t n, auto inner) {
    for (std::int64_t j = 0; j < n; ++j) {
      // Any nonzero byte is true (the bool storage rule of cpu/convert.h).
      po[pos + j] = c[off[0] + j * inner[0]] != 0 ? pa[off[1] + j * inner[1]] : pb[off[2] + j * inner[2]];
    }
    pos += n;
  });
}

// Calls f(T{}) with the type comparisons on `t` run in: float/double for floats (after widening), the
// integer type itself for integers, uint8_t for bool.
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

// Floats detached in their compute dtype (no copy when they already are); other dtypes as they are.
Tensor comparable(const Tensor& t) {
  return is_floating(t.dtype()) ? t.detach().to(compute_dtype(t.dtype())) : t.detach();
}

}  // namespace

void CpuBackend::where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) const {
  const std::size_t es = a.element_size();
  MT_CHECK(es == 1 || es == 2 || es == 4 || es == 8, "where", "unsupported element size {}", es);
  if (!runs_kernels()) return;
  switch (es) {
    case 1: where_typed<std::uint8_t>(cond, a, b, out); break;
    case 2: where_typed<std::uint16_t>(cond, a, b, out); break;
    case 4: where_typed<std::uint32_t>(cond, a, b, out); break;
    default: where_typed<std::uint64_t>(cond, a, b, out); break;
  }
}

void CpuBackend::compare_scalar(const Tensor& out, const Tensor& a, CompareOp op, double s) const {
  const char* name = op == CompareOp::gt ? "gt" : "lt";
  const Tensor x = comparable(a);
  Tensor y = out;
  dispatch_compare(name, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (!runs_kernels()) return;
    // Integers compare as double: exact below 2^53, and a fractional s compares as a real number should.
    if (op == CompareOp::gt) {
      map_unary<T, std::uint8_t>(x, y, [s](T v) { return static_cast<std::uint8_t>(static_cast<double>(v) > s); });
    } else {
      map_unary<T, std::uint8_t>(x, y, [s](T v) { return static_cast<std::uint8_t>(static_cast<double>(v) < s); });
    }
  });
}

void CpuBackend::eq(const Tensor& out, const Tensor& a, const Tensor& b) const {
  const Tensor x = comparable(a), z = comparable(b);
  const Shape& shape = out.shape();
  const bool is_bool = a.dtype() == DType::boolean;
  dispatch_compare("eq", x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (!runs_kernels()) return;
    map_binary<T, std::uint8_t>(x.data<T>(), broadcast_strides(x, shape), z.data<T>(), broadcast_strides(z, shape),
                                out.data<std::uint8_t>(), shape, [is_bool](T p, T q) {
                                  // Bools: any nonzero byte is true, so compare truth, not bytes.
                                  if (is_bool) return static_cast<std::uint8_t>((p != 0) == (q != 0));
                                  return static_cast<std::uint8_t>(p == q);
                                });
  });
}

}  // namespace memtrain::cpu
