// Elementwise ops: unary math and activations, binary arithmetic with broadcasting, scalar ops, where,
// masked_fill and comparisons. Forward values are checked against float64 math written here (std::exp,
// std::erf, ... per element); gradients against central finite differences (tests/gradcheck.h).
// Also the self-test of the gradcheck harness (Gradcheck* suite).
#include "gradcheck.h"
#include "op_test_util.h"

#include "memtrain/autograd/node.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::normal;
using testing::uniform;
using testing::values_of;

constexpr double kPi = 3.14159265358979323846;
constexpr double kBf16Rel = 1.0 / 256;  // one bf16 rounding (8 significant bits) of an f32 result

// ---- unary ops: one table drives forward and gradient tests ----

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input domain for random tests (kept away from kinks, poles and overflow)
};

double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}
double ref_gelu_erf(double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }  // x Phi(x)

std::vector<UnaryCase> unary_cases() {
  return {
      {"abs", [](const Tensor& a) { return ops::abs(a); }, [](double x) { return std::fabs(x); }, -3, 3},
      {"neg", [](const Tensor& a) { return ops::neg(a); }, [](double x) { return -x; }, -3, 3},
      {"exp", [](const Tensor& a) { return ops::exp(a); }, [](double x) { return std::exp(x); }, -4, 4},
      {"log", [](const Tensor& a) { return ops::log(a); }, [](double x) { return std::log(x); }, 0.1, 5},
      {"sqrt", [](const Tensor& a) { return ops::sqrt(a); }, [](double x) { return std::sqrt(x); }, 0.1, 5},
      {"rsqrt", [](const Tensor& a) { return ops::rsqrt(a); }, [](double x) { return 1.0 / std::sqrt(x); }, 0.1, 5},
      {"pow3", [](const Tensor& a) { return ops::pow(a, 3.0); }, [](double x) { return x * x * x; }, -2, 2},
      {"pow2", [](const Tensor& a) { return ops::pow(a, 2.0); }, [](double x) { return x * x; }, -2, 2},
      {"pow_half", [](const Tensor& a) { return ops::pow(a, 0.5); }, [](double x) { return std::sqrt(x); }, 0.1, 4},
      {"pow_neg", [](const Tensor& a) { return ops::pow(a, -1.5); }, [](double x) { return 1.0 / (x * std::sqrt(x)); },
       0.2, 4},
      {"tanh", [](const Tensor& a) { return ops::tanh(a); }, [](double x) { return std::tanh(x); }, -4, 4},
      {"sigmoid", [](const Tensor& a) { return ops::sigmoid(a); }, ref_sigmoid, -8, 8},
      {"relu", [](const Tensor& a) { return ops::relu(a); }, [](double x) { return x > 0 ? x : 0.0; }, -3, 3},
      {"gelu_tanh", [](const Tensor& a) { return ops::gelu(a, ops::GeluApproximation::tanh); }, ref_gelu_tanh, -5, 5},
      {"gelu_erf", [](const Tensor& a) { return ops::gelu(a, ops::GeluApproximation::none); }, ref_gelu_erf, -5, 5},
      {"silu", [](const Tensor& a) { return ops::silu(a); }, [](double x) { return x * ref_sigmoid(x); }, -6, 6},
      {"clamp", [](const Tensor& a) { return ops::clamp(a, -0.5, 0.7); },
       [](double x) { return x < -0.5 ? -0.5 : (x > 0.7 ? 0.7 : x); }, -2, 2},
      {"add_scalar", [](const Tensor& a) { return ops::add(a, 1.25); }, [](double x) { return x + 1.25; }, -3, 3},
      {"sub_scalar", [](const Tensor& a) { return ops::sub(a, 1.25); }, [](double x) { return x - 1.25; }, -3, 3},
      {"rsub_scalar", [](const Tensor& a) { return ops::rsub(1.25, a); }, [](double x) { return 1.25 - x; }, -3, 3},
      {"mul_scalar", [](const Tensor& a) { return ops::mul(a, -2.5); }, [](double x) { return x * -2.5; }, -3, 3},
      {"div_scalar", [](const Tensor& a) { return ops::div(a, 4.0); }, [](double x) { return x / 4.0; }, -3, 3},
      {"rdiv_scalar", [](const Tensor& a) { return ops::rdiv(3.0, a); }, [](double x) { return 3.0 / x; }, 0.5, 3},
  };
}

std::vector<double> apply_ref(const UnaryCase& c, const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = c.ref(x[i]);
  return y;
}

TEST(ElementwiseUnary, ForwardF64MatchesMath) {
  for (const auto& c : unary_cases()) {
    const Tensor x = uniform({3, 5}, c.lo, c.hi, 11);
    const Tensor y = c.op(x);
    EXPECT_EQ(y.shape(), x.shape()) << c.name;
    EXPECT_EQ(y.dtype(), DType::f64) << c.name;
    expect_close(values_of(y), apply_ref(c, values_of(x)), 1e-13, 1e-15, c.name);
  }
}

TEST(ElementwiseUnary, ForwardF32WithinFloatPrecision) {
  for (const auto& c : unary_cases()) {
    const Tensor x = uniform({4, 7}, c.lo, c.hi, 12, DType::f32);
    const Tensor y = c.op(x);
    EXPECT_EQ(y.dtype(), DType::f32) << c.name;
    // Reference from the f32 input values themselves; f32 math is good to a few ulp (~1e-7 relative).
    expect_close(values_of(y), apply_ref(c, values_of(x)), 4e-6, 1e-6, c.name);
  }
}

TEST(ElementwiseUnary, NarrowGeluInBlocksEqualsTheWidenedF32Run) {
  // Contiguous bf16/f16 tanh-GELU runs in stack blocks of 2048; more elements than one block, and a partial
  // last one, must give exactly the f32 kernel on the widened array rounded once, forward and backward.
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = uniform({3, 2731}, -5, 5, 14, dt), g = uniform({3, 2731}, -2, 2, 15, dt);
    const Tensor y = ops::gelu(x, ops::GeluApproximation::tanh);
    ASSERT_EQ(y.dtype(), dt);
    EXPECT_EQ(values_of(y), values_of(ops::gelu(x.to(DType::f32), ops::GeluApproximation::tanh).to(dt)));
    Tensor xn = x.clone().set_requires_grad(), xw = x.to(DType::f32).set_requires_grad();
    ops::gelu(xn, ops::GeluApproximation::tanh).backward(g);
    ops::gelu(xw, ops::GeluApproximation::tanh).backward(g.to(DType::f32));
    ASSERT_EQ(xn.grad().dtype(), dt);
    EXPECT_EQ(values_of(xn.grad()), values_of(xw.grad().to(dt)));
  }
}

TEST(ElementwiseUnary, ForwardBf16WithinOneRounding) {
  for (const auto& c : unary_cases()) {
    const Tensor x = uniform({5, 6}, c.lo, c.hi, 13, DType::bf16);
    const Tensor y = c.op(x);
    EXPECT_EQ(y.dtype(), DType::bf16) << c.name;
    // Computed in f32 from the exact bf16 inputs, then rounded once to bf16.
    expect_close(values_of(y), apply_ref(c, values_of(x)), kBf16Rel, 1e-6, c.name);
  }
}

TEST(ElementwiseUnary, ForwardNonContiguousInputs) {
  for (const auto& c : unary_cases()) {
    const Tensor base = uniform({6, 4}, c.lo, c.hi, 14);
    const std::vector<Tensor> views = {base.t(), base.slice(0, 1, 6, 2), base.select(1, 2),
                                       base.slice(1, 1, 2).expand({6, 3})};
    for (const Tensor& v : views) {
      ASSERT_TRUE(!v.is_contiguous() || v.dim() == 1);
      const Tensor y = c.op(v);
      EXPECT_EQ(y.shape(), v.shape()) << c.name;
      expect_close(values_of(y), apply_ref(c, values_of(v)), 1e-13, 1e-15, c.name + " on view " + shape_str(v.shape()));
    }
  }
}

TEST(ElementwiseUnary, GradientsMatchFiniteDifferences) {
  const std::vector<Shape> shapes = {{7}, {3, 4}, {2, 3, 2}};
  std::uint64_t seed = 100;
  for (const auto& c : unary_cases()) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(c.name + " " + shape_str(shape));
      Tensor x = uniform(shape, c.lo, c.hi, ++seed);
      x.set_requires_grad();
      expect_gradients_match([&c](const std::vector<Tensor>& in) { return c.op(in[0]); }, {x});
    }
  }
}

TEST(ElementwiseUnary, GradientsThroughNonContiguousViews) {
  for (const auto& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = uniform({4, 3}, c.lo, c.hi, 200);
    x.set_requires_grad();
    expect_gradients_match([&c](const std::vector<Tensor>& in) { return c.op(in[0].t()); }, {x});
    expect_gradients_match([&c](const std::vector<Tensor>& in) { return c.op(in[0].slice(0, 0, 4, 2)); }, {x});
    // expand: one element feeds several outputs, so the gradient must sum them.
    expect_gradients_match([&c](const std::vector<Tensor>& in) { return c.op(in[0].slice(1, 0, 1).expand({4, 5})); },
                           {x});
  }
}

TEST(ElementwiseUnary, Bf16GradientWithinBf16OfF64) {
  for (const auto& c : unary_cases()) {
    Tensor xb = uniform({16}, c.lo, c.hi, 300, DType::bf16);
    xb.set_requires_grad();
    ops::sum(c.op(xb)).backward();
    Tensor xd = xb.detach().to(DType::f64);
    xd.set_requires_grad();
    ops::sum(c.op(xd)).backward();
    EXPECT_EQ(xb.grad().dtype(), DType::bf16) << c.name;
    // tanh and sigmoid differentiate from their saved bf16 output y (|dy| <= 2^-9 |y|): 1 - y^2 and
    // y (1 - y) then carry an absolute error up to 2^-8 (as in PyTorch), so near saturation only an
    // absolute bound holds. The others are relative: a few bf16 roundings.
    const bool from_output = c.name == "tanh" || c.name == "sigmoid";
    expect_close(values_of(xb.grad()), values_of(xd.grad()), 3 * kBf16Rel, from_output ? 2 * kBf16Rel : 1e-3,
                 c.name + " bf16 grad");
  }
}

TEST(ElementwiseUnary, EdgeValues) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = tensor(std::vector<double>{-inf, -1000.0, -0.0, 0.0, 1000.0, inf, nan}, {7});
  // sigmoid must not overflow at +-1000 (naive 1 / (1 + exp(1000)) is fine, exp(1000) / (...) is not).
  expect_close(values_of(ops::sigmoid(x)), {0, 0, 0.5, 0.5, 1, 1, nan}, 0, 0, "sigmoid edges");
  expect_close(values_of(ops::silu(x)), {nan, -0.0, 0, 0, 1000, inf, nan}, 0, 0, "silu edges");
  expect_close(values_of(ops::relu(x)), {0, 0, 0, 0, 1000, inf, nan}, 0, 0, "relu keeps NaN");
  expect_close(values_of(ops::clamp(x, -1, 1)), {-1, -1, 0, 0, 1, 1, nan}, 0, 0, "clamp keeps NaN");
  expect_close(values_of(ops::tanh(x)), {-1, -1, 0, 0, 1, 1, nan}, 0, 0, "tanh edges");
  // pow(x, 0) has gradient exactly 0, even at x = 0 (not 0 * inf).
  Tensor z = tensor(std::vector<double>{0.0, 2.0}, {2});
  z.set_requires_grad();
  ops::sum(ops::pow(z, 0.0)).backward();
  expect_close(values_of(z.grad()), {0, 0}, 0, 0, "pow(x, 0) gradient");
}

TEST(ElementwiseUnary, RejectsBadInputs) {
  const Tensor i = zeros({2, 3}, DType::i64);
  for (const auto& c : unary_cases()) expect_error([&] { c.op(i); }, {"[2, 3]", "i64"});
  expect_error([&] { ops::exp(i); }, {"exp", "[2, 3]"});
  expect_error([&] { ops::gelu(zeros({4}, DType::i32)); }, {"gelu", "[4]", "i32"});
  expect_error([&] { ops::clamp(zeros({2}), 1.0, -1.0); }, {"clamp", "[2]"});
}

// ---- binary ops with broadcasting ----

struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
};

std::vector<BinaryCase> binary_cases() {
  return {{"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double x, double y) { return x + y; }},
          {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double x, double y) { return x - y; }},
          {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double x, double y) { return x * y; }},
          {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double x, double y) { return x / y; }}};
}

// Independent broadcasting reference: out[idx] = ref(a[src_a(idx)], b[src_b(idx)]).
std::vector<double> broadcast_ref(const BinaryCase& c, const Tensor& a, const Tensor& b, const Shape& out) {
  const std::vector<double> va = values_of(a), vb = values_of(b);
  std::vector<double> y(static_cast<std::size_t>(shape_numel(out)));
  for (std::size_t i = 0; i < y.size(); ++i) {
    const Shape idx = testing::unravel(static_cast<std::int64_t>(i), out);
    y[i] = c.ref(va[testing::broadcast_source(idx, a.shape())], vb[testing::broadcast_source(idx, b.shape())]);
  }
  return y;
}

struct ShapePair {
  Shape a, b, out;
};
const std::vector<ShapePair> kBroadcastShapes = {
    {{3, 4}, {3, 4}, {3, 4}}, {{2, 1, 4}, {3, 1}, {2, 3, 4}}, {{4}, {2, 3, 4}, {2, 3, 4}},
    {{}, {2, 3}, {2, 3}},     {{5, 1}, {1, 6}, {5, 6}},       {{1}, {1}, {1}}};

TEST(ElementwiseBinary, ForwardBroadcastingMatchesReference) {
  for (const auto& c : binary_cases()) {
    for (const auto& s : kBroadcastShapes) {
      const Tensor a = uniform(s.a, 0.5, 2.0, 21), b = uniform(s.b, 0.5, 2.0, 22);
      const Tensor y = c.op(a, b);
      EXPECT_EQ(y.shape(), s.out) << c.name;
      expect_close(values_of(y), broadcast_ref(c, a, b, s.out), 1e-15, 0, c.name + " " + shape_str(s.out));
      const Tensor yb = c.op(a.to(DType::bf16), b.to(DType::bf16));
      expect_close(values_of(yb), broadcast_ref(c, a.to(DType::bf16), b.to(DType::bf16), s.out), kBf16Rel, 0,
                   c.name + " bf16");
    }
  }
}

TEST(ElementwiseBinary, ForwardNonContiguousOperands) {
  for (const auto& c : binary_cases()) {
    const Tensor base = uniform({4, 6}, 0.5, 2.0, 23);
    const Tensor a = base.t();                          // [6, 4], strides [1, 6]
    const Tensor b = base.slice(1, 0, 6, 3).t();        // [2, 4], strides [3, 6]
    const Tensor row = base.select(1, 5).unsqueeze(0);  // [1, 4], stride 6 inner
    expect_close(values_of(c.op(a, row)), broadcast_ref(c, a, row, {6, 4}), 1e-15, 0, c.name + " t x row");
    expect_close(values_of(c.op(b, b)), broadcast_ref(c, b, b, {2, 4}), 1e-15, 0, c.name + " strided");
    const Tensor e = base.slice(0, 0, 1).expand({3, 6});
    expect_close(values_of(c.op(e, base.slice(0, 1, 4))), broadcast_ref(c, e, base.slice(0, 1, 4), {3, 6}), 1e-15, 0,
                 c.name + " expanded");
  }
}

TEST(ElementwiseBinary, GradientsWithBroadcasting) {
  for (const auto& c : binary_cases()) {
    for (const auto& s : kBroadcastShapes) {
      SCOPED_TRACE(c.name + " " + shape_str(s.a) + " x " + shape_str(s.b));
      Tensor a = uniform(s.a, 0.5, 2.0, 31), b = uniform(s.b, 0.5, 2.0, 32);
      a.set_requires_grad();
      b.set_requires_grad();
      expect_gradients_match([&c](const std::vector<Tensor>& in) { return c.op(in[0], in[1]); }, {a, b});
      // Only one side requiring grad takes the other code path of mul/div.
      Tensor bc = b.detach();
      expect_gradients_match([&c](const std::vector<Tensor>& in) { return c.op(in[0], in[1]); }, {a, bc});
    }
  }
}

TEST(ElementwiseBinary, GradientsSameTensorBothSides) {
  Tensor x = uniform({3, 3}, 0.5, 2.0, 33);
  x.set_requires_grad();
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] * in[0] + in[0] / in[0].t(); }, {x});
}

TEST(ElementwiseBinary, RejectsBadInputs) {
  expect_error([] { ops::add(zeros({2, 3}), zeros({4})); }, {"add", "[2, 3]", "[4]"});
  expect_error([] { ops::mul(zeros({2, 3}), zeros({3, 2})); }, {"mul", "[2, 3]", "[3, 2]"});
  expect_error([] { ops::sub(zeros({2}), zeros({2}, DType::f64)); }, {"sub", "f32", "f64"});
  expect_error([] { ops::div(zeros({2}, DType::i32), zeros({2}, DType::i32)); }, {"div", "[2]", "i32"});
  expect_error([] { ops::add(zeros({2}), Tensor()); }, {"add", "undefined"});
}

TEST(ElementwiseBinary, InPlaceAddAndMul) {
  Tensor s = uniform({2, 3}, -1, 1, 41);
  const std::vector<double> before = values_of(s);
  const Tensor o = uniform({3}, -1, 1, 42);
  ops::add_(s, o);
  std::vector<double> expected = before;
  const std::vector<double> vo = values_of(o);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += vo[i % 3];
  expect_close(values_of(s), expected, 1e-15, 0, "add_");
  ops::mul_(s, 3.0);
  for (double& e : expected) e *= 3.0;
  expect_close(values_of(s), expected, 1e-15, 0, "mul_");
  expect_error([&] { ops::add_(s, zeros({2, 2, 3}, DType::f64)); }, {"add_", "[2, 2, 3]", "[2, 3]"});
}

// ---- where, masked_fill, comparisons ----

Tensor bool_tensor(const std::vector<double>& v, const Shape& shape) { return tensor(v, shape).to(DType::boolean); }

TEST(ElementwiseSelect, WhereBroadcastsAndMatchesReference) {
  const Tensor cond = bool_tensor({1, 0, 1}, {3, 1});
  const Tensor a = uniform({1, 4}, -1, 1, 51), b = uniform({}, -1, 1, 52);
  const Tensor y = ops::where(cond, a, b);
  ASSERT_EQ(y.shape(), (Shape{3, 4}));
  const std::vector<double> va = values_of(a), vb = values_of(b), vy = values_of(y);
  const bool c[3] = {true, false, true};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(vy[i * 4 + j], c[i] ? va[j] : vb[0]);
  // bf16 moves bits, so it is exact; transposed operands read correctly.
  const Tensor ab = uniform({4, 3}, -1, 1, 53, DType::bf16);
  const Tensor yb = ops::where(cond, ab.t(), ab.t() * 2.0);
  ASSERT_EQ(yb.dtype(), DType::bf16);
  const std::vector<double> vab = values_of(ab), vyb = values_of(yb);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(vyb[i * 4 + j], (c[i] ? 1.0 : 2.0) * vab[j * 3 + i]);
}

TEST(ElementwiseSelect, WhereGradients) {
  const Tensor cond = bool_tensor({1, 0, 0, 1, 1, 0}, {2, 3});
  Tensor a = uniform({2, 3}, -1, 1, 54), b = uniform({3}, -1, 1, 55), b1 = uniform({2, 1}, -1, 1, 56);
  a.set_requires_grad();
  b.set_requires_grad();
  b1.set_requires_grad();
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::where(in[2], in[0], in[1]); }, {a, b, cond});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::where(in[2], in[1], in[0]); }, {a, b1, cond});
  // Only one side requiring grad.
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::where(in[2], in[0], in[1]); },
                         {a, b.detach(), cond});
}

TEST(ElementwiseSelect, MaskedFill) {
  const Tensor a = uniform({2, 3}, -1, 1, 57);
  const Tensor mask = bool_tensor({0, 1, 1}, {3});
  const Tensor y = ops::masked_fill(a, mask, -1e9);
  const std::vector<double> va = values_of(a), vy = values_of(y);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(vy[i], (i % 3 == 0) ? va[i] : -1e9);
  // Causal-mask style use on bf16: the fill value is converted once to bf16 (-inf stays -inf).
  const Tensor yb = ops::masked_fill(a.to(DType::bf16), mask, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(yb.dtype(), DType::bf16);
  EXPECT_TRUE(std::isinf(values_of(yb)[1]));
  Tensor x = uniform({2, 3}, -1, 1, 58);
  x.set_requires_grad();
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], in[1], 5.0); }, {x, mask});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::masked_fill(in[0].t(), in[1].unsqueeze(1), 5.0); },
      {x, bool_tensor({1, 0, 1}, {3})});
}

TEST(ElementwiseSelect, Comparisons) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = tensor(std::vector<double>{-2.0, -0.0, 0.0, 0.5, 3.0, nan}, {6});
  const Tensor g = ops::gt(x, 0.0), l = ops::lt(x, 0.5);
  EXPECT_EQ(g.dtype(), DType::boolean);
  EXPECT_FALSE(g.requires_grad());
  expect_close(values_of(g), {0, 0, 0, 1, 1, 0}, 0, 0, "gt");
  expect_close(values_of(l), {1, 1, 1, 0, 0, 0}, 0, 0, "lt");
  // Stored as bytes 0/1.
  const auto* bytes = static_cast<const std::uint8_t*>(g.data_ptr());
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(bytes[i] == 0 || bytes[i] == 1);
  // -0 == 0, NaN != NaN, broadcasting.
  const Tensor e = ops::eq(x, tensor(std::vector<double>{0.0}, {1}));
  expect_close(values_of(e), {0, 1, 1, 0, 0, 0}, 0, 0, "eq vs 0");
  expect_close(values_of(ops::eq(x, x)), {1, 1, 1, 1, 1, 0}, 0, 0, "eq self (NaN differs)");
  // Integers, bools, bf16, and a transposed operand.
  const Tensor i = arange(6, DType::i64).view({2, 3});
  expect_close(values_of(ops::eq(i, i.t().contiguous().view({2, 3}))), {1, 0, 0, 0, 0, 1}, 0, 0, "eq i64");
  expect_close(values_of(ops::gt(i, 2.5)), {0, 0, 0, 1, 1, 1}, 0, 0, "gt i64");
  expect_close(values_of(ops::lt(arange(4, DType::i32), 2)), {1, 1, 0, 0}, 0, 0, "lt i32");
  const Tensor bl = bool_tensor({1, 0, 1}, {3});
  expect_close(values_of(ops::eq(bl, bool_tensor({1, 1, 0}, {3}))), {1, 0, 0}, 0, 0, "eq bool");
  expect_close(values_of(ops::gt(x.to(DType::bf16), 0.25)), {0, 0, 0, 1, 1, 0}, 0, 0, "gt bf16");
  const Tensor m = uniform({3, 4}, -1, 1, 59);
  const std::vector<double> vm = values_of(m), vt = values_of(ops::gt(m.t(), 0.0));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(vt[r * 3 + c], vm[c * 4 + r] > 0 ? 1.0 : 0.0);
}

TEST(ElementwiseSelect, RejectsBadInputs) {
  expect_error([] { ops::where(zeros({2}), zeros({2}), zeros({2})); }, {"where", "bool", "[2]"});
  expect_error([] { ops::where(zeros({2}, DType::boolean), zeros({2}), zeros({2}, DType::f64)); },
               {"where", "f32", "f64"});
  expect_error([] { ops::where(zeros({3}, DType::boolean), zeros({2}), zeros({2})); }, {"where", "[3]", "[2]"});
  expect_error([] { ops::masked_fill(zeros({2, 3}), zeros({2, 1, 3}, DType::boolean), 0.0); },
               {"masked_fill", "[2, 1, 3]", "[2, 3]"});
  expect_error([] { ops::masked_fill(zeros({2, 3}), zeros({2, 3}), 0.0); }, {"masked_fill", "bool"});
  expect_error([] { ops::eq(zeros({2}), zeros({3})); }, {"eq", "[2]", "[3]"});
  expect_error([] { ops::eq(zeros({2}), zeros({2}, DType::i64)); }, {"eq", "f32", "i64"});
  expect_error([] { ops::gt(zeros({2}, DType::boolean), 0.0); }, {"gt", "[2]", "bool"});
}

// ---- the gradcheck harness itself ----

// y = x^2 with a deliberately wrong backward (g * x instead of 2 g x): the harness must catch it.
Tensor square_with_wrong_backward(const Tensor& x) {
  Tensor y = x.detach() * x.detach();
  if (autograd::needs_grad({&x})) {
    autograd::record("bad_square", {x}, {y}, [xs = x.detach()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0] * xs};
    });
  }
  return y;
}

TEST(GradcheckHarness, CatchesAWrongBackward) {
  Tensor x = uniform({5}, 0.5, 2.0, 61);
  x.set_requires_grad();
  EXPECT_NONFATAL_FAILURE(
      expect_gradients_match([](const std::vector<Tensor>& in) { return square_with_wrong_backward(in[0]); }, {x}),
      "differ from central differences");
}

TEST(GradcheckHarness, CatchesAMissingGradient) {
  // The output depends on x, but the graph is cut (detach), so backward leaves no gradient.
  Tensor x = uniform({3}, 0.5, 2.0, 62), w = uniform({3}, 0.5, 2.0, 63);
  x.set_requires_grad();
  w.set_requires_grad();
  EXPECT_NONFATAL_FAILURE(
      expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].detach() * in[1]; }, {x, w}),
      "input 0");
}

TEST(GradcheckHarness, PassesACorrectOpAndLeavesInputsAlone) {
  Tensor x = uniform({2, 3}, 0.5, 2.0, 64);
  x.set_requires_grad();
  const std::vector<double> before = values_of(x);
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] * in[0] * in[0]; }, {x});
  EXPECT_EQ(values_of(x), before);
  EXPECT_FALSE(x.grad().defined());  // the harness works on its own leaf copies
}

// EXPECT_FATAL_FAILURE cannot see locals, so each refused call lives in its own function.
void gradcheck_f32_input() {
  Tensor x = uniform({2}, 0.5, 2.0, 65, DType::f32);
  x.set_requires_grad();
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] * 2.0; }, {x});
}
void gradcheck_nothing_requires_grad() {
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] * 2.0; }, {zeros({2}, DType::f64)});
}

TEST(GradcheckHarness, RefusesF32InputsAndVacuousChecks) {
  EXPECT_FATAL_FAILURE(gradcheck_f32_input(), "must be f64");
  EXPECT_FATAL_FAILURE(gradcheck_nothing_requires_grad(), "no input requires grad");
}

}  // namespace
}  // namespace memtrain
