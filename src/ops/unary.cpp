// Unary math and activations: abs, exp, log, sqrt, rsqrt, pow, tanh, sigmoid, relu, gelu, silu, clamp.
// Each forward is one named elementwise op of the backend (src/core/backend.h: unary; CPU maps in
// src/cpu/elementwise.cpp, where tanh-GELU runs fused array kernels since it is the one activation of a
// GPT's MLP). A backward that needs more than one simple op gets its own small backward op below
// (<op>_backward: one named binary map of the gradient and one saved tensor), so the rule lives once and a
// device backend only adds that op's kernel. Where the derivative is cheaper from the output (exp, sqrt,
// rsqrt, tanh, sigmoid, relu) the output is saved instead of the input.
#include "memtrain/ops/elementwise.h"
#include "ops/elementwise_common.h"

namespace memtrain::ops {

namespace {

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

// The saved tensor of a rule: the forward's input x, or its output y where f' is cheaper from y.
enum class Saves { input, output };

// out = op(a), recording a node whose gradient is backward(g, saved): the shape of every op in this file.
template <typename B>
Tensor unary_op(const char* name, const Tensor& a, UOp op, Saves saves, B backward, double p0 = 0.0,
                double p1 = 0.0) {
  Tensor out = unary_kernel(name, a, op, p0, p1);
  if (needs_grad({&a})) {
    record(name, {a}, {out}, [s = SavedTensor(saves == Saves::output ? out : a), backward](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{backward(g[0], s.unpack())};
    });
  }
  return out;
}

}  // namespace

Tensor abs(const Tensor& a) { return unary_op("abs", a, UOp::abs, Saves::input, abs_backward); }

Tensor exp(const Tensor& a) {
  return unary_op("exp", a, UOp::exp, Saves::output, [](const Tensor& g, const Tensor& y) { return mul(g, y); });
}

Tensor log(const Tensor& a) {
  return unary_op("log", a, UOp::log, Saves::input, [](const Tensor& g, const Tensor& x) { return div(g, x); });
}

Tensor sqrt(const Tensor& a) { return unary_op("sqrt", a, UOp::sqrt, Saves::output, sqrt_backward); }

Tensor rsqrt(const Tensor& a) { return unary_op("rsqrt", a, UOp::rsqrt, Saves::output, rsqrt_backward); }

Tensor pow(const Tensor& a, double exponent) {
  return unary_op(
      "pow", a, UOp::pow, Saves::input,
      [exponent](const Tensor& g, const Tensor& x) { return pow_backward(g, x, exponent); }, exponent);
}

Tensor tanh(const Tensor& a) { return unary_op("tanh", a, UOp::tanh, Saves::output, tanh_backward); }

Tensor sigmoid(const Tensor& a) { return unary_op("sigmoid", a, UOp::sigmoid, Saves::output, sigmoid_backward); }

Tensor relu(const Tensor& a) { return unary_op("relu", a, UOp::relu, Saves::output, relu_backward); }

Tensor gelu(const Tensor& a, GeluApproximation approximation) {
  detail::check_defined("gelu", a);
  return unary_op("gelu", a, approximation == GeluApproximation::tanh ? UOp::gelu_tanh : UOp::gelu_erf,
                  Saves::input,
                  [approximation](const Tensor& g, const Tensor& x) { return gelu_backward(g, x, approximation); });
}

Tensor silu(const Tensor& a) { return unary_op("silu", a, UOp::silu, Saves::input, silu_backward); }

Tensor clamp(const Tensor& a, double lo, double hi) {
  detail::check_floating("clamp", a);
  MT_CHECK(!(lo > hi), "clamp", "lower bound {} above upper bound {} (input {})", lo, hi, shape_str(a.shape()));
  return unary_op(
      "clamp", a, UOp::clamp, Saves::input,
      [lo, hi](const Tensor& g, const Tensor& x) { return clamp_backward(g, x, lo, hi); }, lo, hi);
}

}  // namespace memtrain::ops
