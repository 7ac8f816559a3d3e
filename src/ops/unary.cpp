// Unary math and activations: abs, exp, log, sqrt, rsqrt, pow, tanh, sigmoid, relu, gelu, silu, clamp.
// Each forward is one CPU map (unary_kernel), except tanh-GELU, which has fused array kernels (cpu/gelu.h)
// since it is the one activation of a GPT's MLP and libm's tanhf dominated its cost. A backward that
// needs more than one simple op gets its own small backward op below (<op>_backward: one fused map of the
// gradient and one saved tensor), so the rule lives once and a device backend only adds that op's kernel:
// on CUDA each map names its kernel of memtrain/cuda/elementwise.h (CudaUnary / CudaBinary). Where the
// derivative is cheaper from the output (exp, sqrt, rsqrt, tanh, sigmoid, relu) the output is saved
// instead of the input.
#include "cpu/convert.h"
#include "cpu/gelu.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/cuda/elementwise.h"
#include "memtrain/cuda/nn.h"
#include "memtrain/ops/elementwise.h"
#include "ops/elementwise_common.h"
#include "ops/nn_common.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using detail::binary_kernel;
using detail::CudaBinary;
using detail::CudaUnary;
using detail::is_narrow_contiguous;
using detail::narrow_blocks;
using detail::unary_kernel;

namespace {

using BOp = cuda::BinaryOp;
using UOp = cuda::UnaryOp;

constexpr double kSqrt2OverPi = 0.7978845608028654;    // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;                // GPT-2's tanh-approximation coefficient
constexpr double kInvSqrt2 = 0.7071067811865476;       // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;     // 1 / sqrt(2 pi)

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

// ---- backward ops: dx = g * f'(saved), one map each; not recorded (backward runs without grad) ----

Tensor abs_backward(const Tensor& g, const Tensor& x) {
  return binary_kernel("abs_backward", g, x, CudaBinary{BOp::abs_backward}, [](auto dy, auto v) {
    using T = decltype(v);
    return v > T(0) ? dy : (v < T(0) ? -dy : T(0));
  });
}

Tensor pow_backward(const Tensor& g, const Tensor& x, double exponent) {
  // d x^e = e x^(e-1); exponent 0 gives exactly 0 (not 0 * inf at x = 0).
  return binary_kernel("pow_backward", g, x, CudaBinary{BOp::pow_backward, exponent}, [exponent](auto dy, auto v) {
    using T = decltype(v);
    if (exponent == 0.0) return T(0);
    return dy * T(exponent) * static_cast<T>(std::pow(v, T(exponent - 1.0)));
  });
}

Tensor tanh_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("tanh_backward", g, y, CudaBinary{BOp::tanh_backward},
                       [](auto dy, auto t) { return dy * (decltype(t)(1) - t * t); });
}

Tensor sigmoid_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("sigmoid_backward", g, y, CudaBinary{BOp::sigmoid_backward},
                       [](auto dy, auto s) { return dy * s * (decltype(s)(1) - s); });
}

// relu' from the output: y > 0 exactly where x > 0 (relu'(0) = 0).
Tensor relu_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("relu_backward", g, y, CudaBinary{BOp::relu_backward},
                       [](auto dy, auto v) { return v > decltype(v)(0) ? dy : decltype(v)(0); });
}

Tensor sqrt_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("sqrt_backward", g, y, CudaBinary{BOp::sqrt_backward},
                       [](auto dy, auto s) { return dy * decltype(s)(0.5) / s; });
}

// d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3.
Tensor rsqrt_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("rsqrt_backward", g, y, CudaBinary{BOp::rsqrt_backward},
                       [](auto dy, auto r) { return dy * decltype(r)(-0.5) * r * r * r; });
}

Tensor clamp_backward(const Tensor& g, const Tensor& x, double lo, double hi) {
  return binary_kernel("clamp_backward", g, x, CudaBinary{BOp::clamp_backward, lo, hi}, [lo, hi](auto dy, auto v) {
    using T = decltype(v);
    return (v >= T(lo) && v <= T(hi)) ? dy : T(0);
  });
}

// gelu (tanh) and its backward on the fused array kernels of cpu/gelu.h: inputs in the compute dtype and
// contiguous (a copy only for views), the result back in the input's dtype; contiguous bf16/f16 in blocks
// (narrow_blocks). On a CUDA device, the fused kernels of memtrain/cuda/nn.h for contiguous f32, bf16 or f16,
// the elementwise kernels of memtrain/cuda/elementwise.h (same formula) for anything else.
bool cuda_gelu_fused(const Tensor& t) {
  return detail::is_cuda_kernel_dtype(t.dtype()) && t.is_contiguous();
}

Tensor gelu_tanh_kernel(const Tensor& a) {
  detail::check_floating("gelu", a);
  if (a.device().is_cuda()) {
    // The fused nn kernel takes contiguous f32/bf16; other dtypes and views use the elementwise kernel.
    if (!cuda_gelu_fused(a)) return detail::cuda_unary(a, CudaUnary{UOp::gelu_tanh});
    Tensor y = Tensor::empty(a.shape(), a.dtype(), a.device());
    cuda::gelu_tanh_forward(y.data_ptr(), a.data_ptr(), a.dtype(), static_cast<std::size_t>(a.numel()),
                            a.device().index);
    return y;
  }
  detail::check_cpu("gelu", a);
  if (is_narrow_contiguous(a)) {
    Tensor y = Tensor::empty(a.shape(), a.dtype());
    narrow_blocks<1>(a.dtype(), a.numel(), y.data_ptr(), {a.data_ptr()},
                     [](float* out, const float* x, std::int64_t len) { cpu::gelu_tanh_forward<float>(out, x, len); });
    return y;
  }
  Tensor x = detail::to_compute(a);
  if (!x.is_contiguous()) x = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  detail::dispatch_compute("gelu", x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::gelu_tanh_forward<T>(y.data<T>(), x.data<T>(), x.numel());
  });
  return y.dtype() == a.dtype() ? y : y.to(a.dtype());
}

Tensor gelu_tanh_backward_kernel(const Tensor& g, const Tensor& x) {
  if (g.shape() != x.shape()) {  // never from gelu's own node; kept general like the other backward ops
    return binary_kernel("gelu_backward", g, x, CudaBinary{BOp::gelu_tanh_backward},
                         [](auto dy, auto v) { return dy * gelu_tanh_grad(v); });
  }
  detail::check_same("gelu_backward", g, x);
  detail::check_floating("gelu_backward", x);
  if (x.device().is_cuda()) {
    if (!cuda_gelu_fused(g) || !cuda_gelu_fused(x)) {
      return detail::cuda_binary(g, x, x.shape(), CudaBinary{BOp::gelu_tanh_backward});
    }
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    cuda::gelu_tanh_backward(dx.data_ptr(), g.data_ptr(), x.data_ptr(), x.dtype(), static_cast<std::size_t>(x.numel()),
                             x.device().index);
    return dx;
  }
  detail::check_cpu("gelu_backward", x);
  if (is_narrow_contiguous(x) && is_narrow_contiguous(g)) {
    Tensor dx = Tensor::empty(x.shape(), x.dtype());
    narrow_blocks<2>(x.dtype(), x.numel(), dx.data_ptr(), {g.data_ptr(), x.data_ptr()},
                     [](float* out, const float* dy, const float* v, std::int64_t len) {
                       cpu::gelu_tanh_backward<float>(out, dy, v, len);
                     });
    return dx;
  }
  Tensor gc = detail::to_compute(g), xc = detail::to_compute(x);
  if (!gc.is_contiguous()) gc = gc.contiguous();
  if (!xc.is_contiguous()) xc = xc.contiguous();
  Tensor dx = Tensor::empty(xc.shape(), xc.dtype());
  detail::dispatch_compute("gelu_backward", xc.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::gelu_tanh_backward<T>(dx.data<T>(), gc.data<T>(), xc.data<T>(), xc.numel());
  });
  return dx.dtype() == x.dtype() ? dx : dx.to(x.dtype());
}

Tensor gelu_backward(const Tensor& g, const Tensor& x, GeluApproximation approximation) {
  if (approximation == GeluApproximation::tanh) return gelu_tanh_backward_kernel(g, x);
  return binary_kernel("gelu_backward", g, x, CudaBinary{BOp::gelu_erf_backward},
                       [](auto dy, auto v) { return dy * gelu_erf_grad(v); });
}

// silu = x s(x); silu' = s (1 + x (1 - s)).
Tensor silu_backward(const Tensor& g, const Tensor& x) {
  return binary_kernel("silu_backward", g, x, CudaBinary{BOp::silu_backward}, [](auto dy, auto v) {
    using T = decltype(v);
    const T s = stable_sigmoid(v);
    return dy * s * (T(1) + v * (T(1) - s));
  });
}

// Records a node whose gradient is backward(g, saved): the common shape of every op in this file.
template <typename B>
void record_unary(const char* name, const Tensor& a, const Tensor& out, const Tensor& saved, B backward) {
  record(name, {a}, {out}, [s = SavedTensor(saved), backward](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{backward(g[0], s.unpack())};
  });
}

}  // namespace

Tensor abs(const Tensor& a) {
  Tensor out = unary_kernel("abs", a, CudaUnary{UOp::abs}, [](auto x) { return std::abs(x); });
  if (needs_grad({&a})) record_unary("abs", a, out, a, abs_backward);
  return out;
}

Tensor exp(const Tensor& a) {
  Tensor out = unary_kernel("exp", a, CudaUnary{UOp::exp}, [](auto x) { return std::exp(x); });
  if (needs_grad({&a})) record_unary("exp", a, out, out, [](const Tensor& g, const Tensor& y) { return mul(g, y); });
  return out;
}

Tensor log(const Tensor& a) {
  Tensor out = unary_kernel("log", a, CudaUnary{UOp::log}, [](auto x) { return std::log(x); });
  if (needs_grad({&a})) record_unary("log", a, out, a, [](const Tensor& g, const Tensor& x) { return div(g, x); });
  return out;
}

Tensor sqrt(const Tensor& a) {
  Tensor out = unary_kernel("sqrt", a, CudaUnary{UOp::sqrt}, [](auto x) { return std::sqrt(x); });
  if (needs_grad({&a})) record_unary("sqrt", a, out, out, sqrt_backward);
  return out;
}

Tensor rsqrt(const Tensor& a) {
  Tensor out = unary_kernel("rsqrt", a, CudaUnary{UOp::rsqrt}, [](auto x) { return decltype(x)(1) / std::sqrt(x); });
  if (needs_grad({&a})) record_unary("rsqrt", a, out, out, rsqrt_backward);
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  Tensor out = unary_kernel("pow", a, CudaUnary{UOp::pow, exponent}, [exponent](auto x) {
    using T = decltype(x);
    if (exponent == 2.0) return x * x;  // exact and the common case (squares in norms and losses)
    return static_cast<T>(std::pow(x, T(exponent)));
  });
  if (needs_grad({&a})) {
    record_unary("pow", a, out, a,
                 [exponent](const Tensor& g, const Tensor& x) { return pow_backward(g, x, exponent); });
  }
  return out;
}

Tensor tanh(const Tensor& a) {
  Tensor out = unary_kernel("tanh", a, CudaUnary{UOp::tanh}, [](auto x) { return std::tanh(x); });
  if (needs_grad({&a})) record_unary("tanh", a, out, out, tanh_backward);
  return out;
}

Tensor sigmoid(const Tensor& a) {
  Tensor out = unary_kernel("sigmoid", a, CudaUnary{UOp::sigmoid}, [](auto x) { return stable_sigmoid(x); });
  if (needs_grad({&a})) record_unary("sigmoid", a, out, out, sigmoid_backward);
  return out;
}

Tensor relu(const Tensor& a) {
  // x < 0 ? 0 : x keeps NaN as NaN.
  Tensor out = unary_kernel("relu", a, CudaUnary{UOp::relu},
                            [](auto x) { return x < decltype(x)(0) ? decltype(x)(0) : x; });
  if (needs_grad({&a})) record_unary("relu", a, out, out, relu_backward);
  return out;
}

Tensor gelu(const Tensor& a, GeluApproximation approximation) {
  detail::check_defined("gelu", a);
  Tensor out = approximation == GeluApproximation::tanh
                   ? gelu_tanh_kernel(a)
                   : unary_kernel("gelu", a, CudaUnary{UOp::gelu_erf}, [](auto x) { return gelu_erf(x); });
  if (needs_grad({&a})) {
    record_unary("gelu", a, out, a, [approximation](const Tensor& g, const Tensor& x) {
      return gelu_backward(g, x, approximation);
    });
  }
  return out;
}

Tensor silu(const Tensor& a) {
  Tensor out = unary_kernel("silu", a, CudaUnary{UOp::silu}, [](auto x) { return x * stable_sigmoid(x); });
  if (needs_grad({&a})) record_unary("silu", a, out, a, silu_backward);
  return out;
}

Tensor clamp(const Tensor& a, double lo, double hi) {
  detail::check_floating("clamp", a);
  MT_CHECK(!(lo > hi), "clamp", "lower bound {} above upper bound {} (input {})", lo, hi, shape_str(a.shape()));
  // Written as comparisons (not std::clamp) so NaN passes through as NaN.
  Tensor out = unary_kernel("clamp", a, CudaUnary{UOp::clamp, lo, hi}, [lo, hi](auto x) {
    using T = decltype(x);
    return x < T(lo) ? T(lo) : (x > T(hi) ? T(hi) : x);
  });
  if (needs_grad({&a})) {
    record_unary("clamp", a, out, a, [lo, hi](const Tensor& g, const Tensor& x) { return clamp_backward(g, x, lo, hi); });
  }
  return out;
}

}  // namespace memtrain::ops
