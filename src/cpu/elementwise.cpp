// The CPU backend's elementwise entries (src/core/backend.h: unary, binary): each named op is one lambda
// run by the maps of cpu/map.h in the compute dtype (f32, or f64 for f64), the result rounded once into
// the output's dtype. tanh-GELU and its backward run the fused array kernels of cpu/gelu.h instead (libm's
// tanhf dominated its cost). Contiguous bf16/f16 operands of the output's shape are widened in stack blocks
// (narrow_blocks) instead of as full-size f32 copies.
#include "cpu/convert.h"
#include "cpu/cpu_backend.h"
#include "cpu/gelu.h"
#include "cpu/map.h"
#include "cpu/sigmoid.h"
#include "memtrain/core/error.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace memtrain::cpu {

namespace {

using UnaryOp = detail::Backend::UnaryOp;
using BinaryOp = detail::Backend::BinaryOp;

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;              // GPT-2's tanh-approximation coefficient
constexpr double kInvSqrt2 = 0.7071067811865476;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;   // 1 / sqrt(2 pi)

// 1 / (1 + e^-x) without overflow of e^-x for very negative x.
template <typename T>
T stable_sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T z = std::exp(x);
  return z / (T(1) + z);
}

template <typename T>
T gelu_tanh_grad(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
  const T t = std::tanh(u);
  const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

template <typename T>
T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
}

// d/dx x Phi(x) = Phi(x) + x phi(x).
template <typename T>
T gelu_erf_grad(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2)));
  return cdf + x * T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
}

// Calls f(lambda) with the map of `op` (generic over float and double).
template <typename F>
void with_unary(UnaryOp op, double p0, double p1, F&& f) {
  switch (op) {
    case UnaryOp::add_scalar: return f([p0](auto x) { return x + static_cast<decltype(x)>(p0); });
    case UnaryOp::mul_scalar: return f([p0](auto x) { return x * static_cast<decltype(x)>(p0); });
    case UnaryOp::rdiv_scalar: return f([p0](auto x) { return static_cast<decltype(x)>(p0) / x; });
    case UnaryOp::neg: return f([](auto x) { return -x; });
    case UnaryOp::abs: return f([](auto x) { return std::abs(x); });
    case UnaryOp::exp: return f([](auto x) { return std::exp(x); });
    case UnaryOp::log: return f([](auto x) { return std::log(x); });
    case UnaryOp::sqrt: return f([](auto x) { return std::sqrt(x); });
    case UnaryOp::rsqrt: return f([](auto x) { return decltype(x)(1) / std::sqrt(x); });
    case UnaryOp::pow:
      return f([p0](auto x) {
        using T = decltype(x);
        if (p0 == 2.0) return x * x;  // exact and the common case (squares in norms and losses)
        return static_cast<T>(std::pow(x, T(p0)));
      });
    case UnaryOp::tanh: return f([](auto x) { return std::tanh(x); });
    case UnaryOp::sigmoid: return f([](auto x) { return stable_sigmoid(x); });
    // x < 0 ? 0 : x keeps NaN as NaN.
    case UnaryOp::relu: return f([](auto x) { return x < decltype(x)(0) ? decltype(x)(0) : x; });
    case UnaryOp::gelu_erf: return f([](auto x) { return gelu_erf(x); });
    case UnaryOp::gelu_tanh: break;  // the array kernel only (unary_by_array)
    case UnaryOp::silu: return f([](auto x) { return x * stable_sigmoid(x); });
    // Written as comparisons (not std::clamp) so NaN passes through as NaN.
    case UnaryOp::clamp:
      return f([p0, p1](auto x) {
        using T = decltype(x);
        return x < T(p0) ? T(p0) : (x > T(p1) ? T(p1) : x);
      });
  }
  ::memtrain::detail::throw_error("unary", fmt::format("no CPU map for op {}", static_cast<int>(op)));
}

template <typename F>
void with_binary(BinaryOp op, double p0, double p1, F&& f) {
  switch (op) {
    case BinaryOp::add: return f([](auto x, auto y) { return x + y; });
    case BinaryOp::sub: return f([](auto x, auto y) { return x - y; });
    case BinaryOp::mul: return f([](auto x, auto y) { return x * y; });
    case BinaryOp::div: return f([](auto x, auto y) { return x / y; });
    case BinaryOp::abs_backward:
      return f([](auto dy, auto v) {
        using T = decltype(v);
        return v > T(0) ? dy : (v < T(0) ? -dy : T(0));
      });
    // d x^e = e x^(e-1); exponent 0 gives exactly 0 (not 0 * inf at x = 0).
    case BinaryOp::pow_backward:
      return f([p0](auto dy, auto v) {
        using T = decltype(v);
        if (p0 == 0.0) return T(0);
        return dy * T(p0) * static_cast<T>(std::pow(v, T(p0 - 1.0)));
      });
    case BinaryOp::tanh_backward: return f([](auto dy, auto t) { return dy * (decltype(t)(1) - t * t); });
    case BinaryOp::sigmoid_backward: return f([](auto dy, auto s) { return dy * s * (decltype(s)(1) - s); });
    // relu' from the output: y > 0 exactly where x > 0 (relu'(0) = 0).
    case BinaryOp::relu_backward:
      return f([](auto dy, auto v) { return v > decltype(v)(0) ? dy : decltype(v)(0); });
    case BinaryOp::sqrt_backward: return f([](auto dy, auto s) { return dy * decltype(s)(0.5) / s; });
    // d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3.
    case BinaryOp::rsqrt_backward: return f([](auto dy, auto r) { return dy * decltype(r)(-0.5) * r * r * r; });
    case BinaryOp::clamp_backward:
      return f([p0, p1](auto dy, auto v) {
        using T = decltype(v);
        return (v >= T(p0) && v <= T(p1)) ? dy : T(0);
      });
    case BinaryOp::gelu_erf_backward: return f([](auto dy, auto v) { return dy * gelu_erf_grad(v); });
    // The map serves broadcast operands; same-shape ones take the array kernel (binary_by_array).
    case BinaryOp::gelu_tanh_backward: return f([](auto dy, auto v) { return dy * gelu_tanh_grad(v); });
    // silu = x s(x); silu' = s (1 + x (1 - s)).
    case BinaryOp::silu_backward:
      return f([](auto dy, auto v) {
        using T = decltype(v);
        const T s = stable_sigmoid(v);
        return dy * s * (T(1) + v * (T(1) - s));
      });
  }
  ::memtrain::detail::throw_error("binary", fmt::format("no CPU map for op {}", static_cast<int>(op)));
}

// Contiguous bf16/f16 arrays of n elements through an f32 array kernel in blocks widened on the stack, so a
// narrow activation never gets a full-size f32 copy (mixed precision stores activations narrow to halve them;
// f32 temporaries of their size would give the saving back at the forward's peak). kernel(out, in..., len)
// runs on f32 blocks; each result is rounded once, as widening the whole array would give. Each block reads
// its inputs before writing its output, so out may be an input (in place).
constexpr std::int64_t kNarrowBlock = 2048;

template <std::size_t kInputs, typename Kernel>
void narrow_blocks(DType dtype, std::int64_t n, void* out, const std::array<const void*, kInputs>& in, Kernel kernel) {
  const std::size_t es = dtype_size(dtype);
  const std::int64_t blocks = (n + kNarrowBlock - 1) / kNarrowBlock;
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::array<std::array<float, kNarrowBlock>, kInputs + 1> buf;
    const std::int64_t off = b * kNarrowBlock, len = std::min(kNarrowBlock, n - off);
    for (std::size_t i = 0; i < kInputs; ++i)
      convert(static_cast<const unsigned char*>(in[i]) + off * es, dtype, buf[i + 1].data(), DType::f32,
              static_cast<std::size_t>(len));
    if constexpr (kInputs == 1) kernel(buf[0].data(), buf[1].data(), len);
    else kernel(buf[0].data(), buf[1].data(), buf[2].data(), len);
    convert(buf[0].data(), DType::f32, static_cast<unsigned char*>(out) + off * es, dtype,
            static_cast<std::size_t>(len));
  }
}

bool is_narrow_contiguous(const Tensor& t) {
  return (t.dtype() == DType::bf16 || t.dtype() == DType::f16) && t.is_contiguous();
}

// The ops with an array kernel on a vectorized exp (cpu/gelu.h, cpu/sigmoid.h); null for the others.
template <typename T>
using UnaryArray = void (*)(T*, const T*, std::int64_t);
template <typename T>
using BinaryArray = void (*)(T*, const T*, const T*, std::int64_t);

template <typename T>
UnaryArray<T> unary_array(UnaryOp op) {
  switch (op) {
    case UnaryOp::gelu_tanh: return gelu_tanh_forward<T>;
    case UnaryOp::sigmoid: return sigmoid_forward<T>;
    case UnaryOp::silu: return silu_forward<T>;
    default: return nullptr;
  }
}

template <typename T>
BinaryArray<T> binary_array(BinaryOp op) {
  switch (op) {
    case BinaryOp::gelu_tanh_backward: return gelu_tanh_backward<T>;
    case BinaryOp::silu_backward: return silu_backward<T>;
    default: return nullptr;
  }
}

// out = op(a) by its array kernel: contiguous operands in the compute dtype (a copy only for views).
void unary_by_array(const CpuBackend& backend, const Tensor& out, const Tensor& a, UnaryOp op) {
  if (is_narrow_contiguous(a) && out.is_contiguous()) {
    if (backend.runs_kernels())
      narrow_blocks<1>(a.dtype(), a.numel(), out.data_ptr(), {a.data_ptr()},
                       [op](float* y, const float* x, std::int64_t len) { unary_array<float>(op)(y, x, len); });
    return;
  }
  Tensor x = widened(a);
  if (!x.is_contiguous()) x = x.contiguous();
  const Tensor y = compute_result(out, x.dtype());
  if (backend.runs_kernels()) {
    dispatch_compute("unary", x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      unary_array<T>(op)(y.data<T>(), x.data<T>(), x.numel());
    });
  }
  finish_result(out, y);
}

// out = op(g, x) by its array kernel, g and x of out's shape.
void binary_by_array(const CpuBackend& backend, const Tensor& out, const Tensor& g, const Tensor& x, BinaryOp op) {
  if (is_narrow_contiguous(x) && is_narrow_contiguous(g) && out.is_contiguous()) {
    if (backend.runs_kernels())
      narrow_blocks<2>(x.dtype(), x.numel(), out.data_ptr(), {g.data_ptr(), x.data_ptr()},
                       [op](float* dx, const float* dy, const float* v, std::int64_t len) {
                         binary_array<float>(op)(dx, dy, v, len);
                       });
    return;
  }
  Tensor gc = widened(g), xc = widened(x);
  if (!gc.is_contiguous()) gc = gc.contiguous();
  if (!xc.is_contiguous()) xc = xc.contiguous();
  const Tensor dx = compute_result(out, xc.dtype());
  if (backend.runs_kernels()) {
    dispatch_compute("binary", xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      binary_array<T>(op)(dx.data<T>(), gc.data<T>(), xc.data<T>(), xc.numel());
    });
  }
  finish_result(out, dx);
}

}  // namespace

void CpuBackend::unary(const Tensor& out, const Tensor& a, UnaryOp op, double p0, double p1) const {
  // gelu (tanh) has no element map; sigmoid and silu take theirs only for views (an array kernel would copy them).
  if (op == UnaryOp::gelu_tanh || (unary_array<float>(op) != nullptr && a.is_contiguous()))
    return unary_by_array(*this, out, a, op);
  if (is_narrow_contiguous(a) && out.is_contiguous()) {
    if (runs_kernels()) {
      with_unary(op, p0, p1, [&](auto f) {
        narrow_blocks<1>(a.dtype(), a.numel(), out.data_ptr(), {a.data_ptr()},
                         [&](float* y, const float* x, std::int64_t len) {
                           for (std::int64_t i = 0; i < len; ++i) y[i] = static_cast<float>(f(x[i]));
                         });
      });
    }
    return;
  }
  const Tensor x = widened(a);
  Tensor y = compute_result(out, x.dtype());
  if (runs_kernels()) {
    with_unary(op, p0, p1, [&](auto f) {
      dispatch_compute("unary", x.dtype(), [&](auto zero) {
        using T = decltype(zero);
        map_unary<T>(x, y, [&](T v) { return static_cast<T>(f(v)); });
      });
    });
  }
  finish_result(out, y);
}

void CpuBackend::binary(const Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op, double p0,
                        double p1) const {
  const Shape& shape = out.shape();
  const bool same_shape = a.shape() == shape && b.shape() == shape;
  // The element map serves broadcast operands and views.
  if (binary_array<float>(op) != nullptr && same_shape && (op == BinaryOp::gelu_tanh_backward ||
                                                           (a.is_contiguous() && b.is_contiguous())))
    return binary_by_array(*this, out, a, b, op);
  if (is_narrow_contiguous(a) && is_narrow_contiguous(b) && same_shape && out.is_contiguous()) {
    if (runs_kernels()) {
      with_binary(op, p0, p1, [&](auto f) {
        narrow_blocks<2>(a.dtype(), out.numel(), out.data_ptr(), {a.data_ptr(), b.data_ptr()},
                         [&](float* o, const float* x, const float* z, std::int64_t len) {
                           for (std::int64_t i = 0; i < len; ++i) o[i] = static_cast<float>(f(x[i], z[i]));
                         });
      });
    }
    return;
  }
  const Tensor x = widened(a), z = widened(b);
  const Tensor y = compute_result(out, x.dtype());
  if (runs_kernels()) {
    const Shape xs = broadcast_strides(x, shape), zs = broadcast_strides(z, shape);
    with_binary(op, p0, p1, [&](auto f) {
      dispatch_compute("binary", x.dtype(), [&](auto zero) {
        using T = decltype(zero);
        map_binary<T>(x.data<T>(), xs, z.data<T>(), zs, y.data<T>(), shape,
                      [&](T p, T q) { return static_cast<T>(f(p, q)); });
      });
    });
  }
  finish_result(out, y);
}

}  // namespace memtrain::cpu
