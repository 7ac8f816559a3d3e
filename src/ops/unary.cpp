// Unary math and activations: abs, exp, log, sqrt, rsqrt, pow, tanh, sigmoid, relu, gelu, silu, clamp.
// Each forward is one named elementwise op of the backend (src/core/backend.h: unary; CPU maps in
// src/cpu/elementwise.cpp, where tanh-GELU runs fused array kernels since it is the one activation of a
// GPT's MLP). A backward that needs more than one simple op gets its own small backward op below
// (<op>_backward: one named binary map of the gradient and one saved tensor), so the rule lives once and a
// device backend only adds that op's kernel. Where the derivative is cheaper from the output (exp, sqrt,
// rsqrt, tanh, sigmoid, relu) the output is saved instead of the input.
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/ops/elementwise.h"
#include "ops/elementwise_common.h"

namespace memtrain::ops {

using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using detail::binary_kernel;
using detail::unary_kernel;

namespace {

using BOp = detail::BinaryOp;
using UOp = detail::UnaryOp;

// ---- backward ops: dx = g * f'(saved), one map each; not recorded (backward runs without grad) ----

Tensor abs_backward(const Tensor& g, const Tensor& x) { return binary_kernel("abs_backward", g, x, BOp::abs_backward); }

Tensor pow_backward(const Tensor& g, const Tensor& x, double exponent) {
  return binary_kernel("pow_backward", g, x, BOp::pow_backward, exponent);
}

Tensor tanh_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("tanh_backward", g, y, BOp::tanh_backward);
}

Tensor sigmoid_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("sigmoid_backward", g, y, BOp::sigmoid_backward);
}

Tensor relu_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("relu_backward", g, y, BOp::relu_backward);
}

Tensor sqrt_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("sqrt_backward", g, y, BOp::sqrt_backward);
}

Tensor rsqrt_backward(const Tensor& g, const Tensor& y) {
  return binary_kernel("rsqrt_backward", g, y, BOp::rsqrt_backward);
}

Tensor clamp_backward(const Tensor& g, const Tensor& x, double lo, double hi) {
  return binary_kernel("clamp_backward", g, x, BOp::clamp_backward, lo, hi);
}

Tensor gelu_backward(const Tensor& g, const Tensor& x, GeluApproximation approximation) {
  return binary_kernel("gelu_backward", g, x,
                       approximation == GeluApproximation::tanh ? BOp::gelu_tanh_backward : BOp::gelu_erf_backward);
}

Tensor silu_backward(const Tensor& g, const Tensor& x) {
  return binary_kernel("silu_backward", g, x, BOp::silu_backward);
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
  Tensor out = unary_kernel("abs", a, UOp::abs);
  if (needs_grad({&a})) record_unary("abs", a, out, a, abs_backward);
  return out;
}

Tensor exp(const Tensor& a) {
  Tensor out = unary_kernel("exp", a, UOp::exp);
  if (needs_grad({&a})) record_unary("exp", a, out, out, [](const Tensor& g, const Tensor& y) { return mul(g, y); });
  return out;
}

Tensor log(const Tensor& a) {
  Tensor out = unary_kernel("log", a, UOp::log);
  if (needs_grad({&a})) record_unary("log", a, out, a, [](const Tensor& g, const Tensor& x) { return div(g, x); });
  return out;
}

Tensor sqrt(const Tensor& a) {
  Tensor out = unary_kernel("sqrt", a, UOp::sqrt);
  if (needs_grad({&a})) record_unary("sqrt", a, out, out, sqrt_backward);
  return out;
}

Tensor rsqrt(const Tensor& a) {
  Tensor out = unary_kernel("rsqrt", a, UOp::rsqrt);
  if (needs_grad({&a})) record_unary("rsqrt", a, out, out, rsqrt_backward);
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  Tensor out = unary_kernel("pow", a, UOp::pow, exponent);
  if (needs_grad({&a})) {
    record_unary("pow", a, out, a,
                 [exponent](const Tensor& g, const Tensor& x) { return pow_backward(g, x, exponent); });
  }
  return out;
}

Tensor tanh(const Tensor& a) {
  Tensor out = unary_kernel("tanh", a, UOp::tanh);
  if (needs_grad({&a})) record_unary("tanh", a, out, out, tanh_backward);
  return out;
}

Tensor sigmoid(const Tensor& a) {
  Tensor out = unary_kernel("sigmoid", a, UOp::sigmoid);
  if (needs_grad({&a})) record_unary("sigmoid", a, out, out, sigmoid_backward);
  return out;
}

Tensor relu(const Tensor& a) {
  Tensor out = unary_kernel("relu", a, UOp::relu);
  if (needs_grad({&a})) record_unary("relu", a, out, out, relu_backward);
  return out;
}

Tensor gelu(const Tensor& a, GeluApproximation approximation) {
  detail::check_defined("gelu", a);
  Tensor out = unary_kernel("gelu", a, approximation == GeluApproximation::tanh ? UOp::gelu_tanh : UOp::gelu_erf);
  if (needs_grad({&a})) {
    record_unary("gelu", a, out, a, [approximation](const Tensor& g, const Tensor& x) {
      return gelu_backward(g, x, approximation);
    });
  }
  return out;
}

Tensor silu(const Tensor& a) {
  Tensor out = unary_kernel("silu", a, UOp::silu);
  if (needs_grad({&a})) record_unary("silu", a, out, a, silu_backward);
  return out;
}

Tensor clamp(const Tensor& a, double lo, double hi) {
  detail::check_floating("clamp", a);
  MT_CHECK(!(lo > hi), "clamp", "lower bound {} above upper bound {} (input {})", lo, hi, shape_str(a.shape()));
  Tensor out = unary_kernel("clamp", a, UOp::clamp, lo, hi);
  if (needs_grad({&a})) {
    record_unary("clamp", a, out, a, [lo, hi](const Tensor& g, const Tensor& x) { return clamp_backward(g, x, lo, hi); });
  }
  return out;
}

}  // namespace memtrain::ops
