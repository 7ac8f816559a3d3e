// Reductions (sum, mean, max, argmax, sum_to), views (the differentiable Tensor methods) and joining /
// splitting (concat, split, chunk). Forward values against brute-force loops over multi-indices written
// here; gradients against central finite differences (tests/gradcheck.h).
#include "gradcheck.h"
#include "op_test_util.h"

#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/ops/shape.h"

#include <gtest/gtest.h>

#include <algorithm>
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
using testing::unravel;
using testing::values_of;

// ---- reductions ----

struct DimsCase {
  Shape dims;
  bool keepdim;
};

// Brute-force sum over `dims` (empty = all): each input element adds into the output position with its
// reduced coordinates dropped (or set to 0 with keepdim).
std::vector<double> ref_sum(const std::vector<double>& x, const Shape& shape, Shape dims, bool keepdim, Shape* out_shape) {
  const auto rank = static_cast<std::int64_t>(shape.size());
  std::vector<bool> reduced(shape.size(), dims.empty());
  for (auto d : dims) reduced[(d + rank) % rank] = true;
  Shape keep = shape, out;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (reduced[k]) keep[k] = 1;
    if (!reduced[k] || keepdim) out.push_back(keep[k]);
  }
  *out_shape = out;
  std::vector<double> y(static_cast<std::size_t>(shape_numel(keep)), 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    Shape idx = unravel(static_cast<std::int64_t>(i), shape);
    std::int64_t flat = 0;
    for (std::size_t k = 0; k < shape.size(); ++k) flat = flat * keep[k] + (reduced[k] ? 0 : idx[k]);
    y[flat] += x[i];
  }
  return y;
}

const std::vector<DimsCase> kDims = {{{}, false}, {{}, true},      {{0}, false},    {{1}, true},
                                     {{-1}, false}, {{0, 2}, false}, {{2, 1}, true}, {{0, 1, 2}, false}};

TEST(ReduceSum, MatchesBruteForce) {
  const Tensor x = uniform({2, 3, 4}, -1, 1, 1);
  for (const auto& c : kDims) {
    Shape expected_shape;
    const std::vector<double> expected = ref_sum(values_of(x), x.shape(), c.dims, c.keepdim, &expected_shape);
    const Tensor s = ops::sum(x, c.dims, c.keepdim);
    EXPECT_EQ(s.shape(), expected_shape) << shape_str(c.dims);
    expect_close(values_of(s), expected, 1e-14, 1e-15, "sum " + shape_str(c.dims));
    // Non-contiguous input (a permuted view of the same values) and f32.
    const Tensor xp = x.permute({2, 0, 1}).contiguous().permute({1, 2, 0});
    ASSERT_FALSE(xp.is_contiguous());
    expect_close(values_of(ops::sum(xp, c.dims, c.keepdim)), expected, 1e-14, 1e-15, "sum of permuted view");
    expect_close(values_of(ops::sum(x.to(DType::f32), c.dims, c.keepdim)), expected, 1e-6, 1e-6, "sum f32");
    // mean = sum / count
    std::int64_t count = 1;
    for (std::int64_t k = 0; k < 3; ++k) {
      const bool reduced = c.dims.empty() || std::count(c.dims.begin(), c.dims.end(), k) > 0 ||
                           std::count(c.dims.begin(), c.dims.end(), k - 3) > 0;
      if (reduced) count *= x.shape()[k];
    }
    std::vector<double> mean = expected;
    for (double& m : mean) m /= static_cast<double>(count);
    expect_close(values_of(ops::mean(x, c.dims, c.keepdim)), mean, 1e-14, 1e-15, "mean " + shape_str(c.dims));
  }
}

TEST(ReduceSum, Bf16SumsInHighPrecisionThenRoundsOnce) {
  // 4096 ones plus one 1/128: an f32/bf16 running sum would stall at 256 in bf16; the f64 accumulator does not.
  std::vector<double> v(4096, 1.0);
  const Tensor x = tensor(v, {64, 64}).to(DType::bf16);
  EXPECT_EQ(values_of(ops::sum(x))[0], 4096.0);
  expect_close(values_of(ops::sum(x, {1})), std::vector<double>(64, 64.0), 0, 0, "bf16 row sums");
}

TEST(ReduceSum, ScalarsAndEmpty) {
  const Tensor s = tensor(std::vector<double>{2.5}, {}).to(DType::f64);
  EXPECT_EQ(ops::sum(s).item(), 2.5);
  EXPECT_EQ(ops::sum(s, {0}).item(), 2.5);
  EXPECT_EQ(ops::sum(s, {-1}, true).shape(), Shape{});
  EXPECT_EQ(ops::sum(zeros({0, 3}, DType::f64)).item(), 0.0);
  EXPECT_EQ(ops::sum(zeros({0, 3}, DType::f64), {0}).shape(), (Shape{3}));
}

TEST(ReduceSum, GradientsMatchFiniteDifferences) {
  for (const auto& c : kDims) {
    SCOPED_TRACE(shape_str(c.dims));
    Tensor x = uniform({2, 3, 4}, -1, 1, 2);
    x.set_requires_grad();
    expect_gradients_match([&c](const std::vector<Tensor>& in) { return ops::sum(in[0], c.dims, c.keepdim); }, {x});
    expect_gradients_match([&c](const std::vector<Tensor>& in) { return ops::mean(in[0].transpose(0, 2), c.dims, c.keepdim); },
                           {x});
  }
}

TEST(ReduceSum, SumToUndoesBroadcast) {
  const Tensor x = uniform({2, 3, 4}, -1, 1, 3);
  Shape ignored;
  expect_close(values_of(ops::sum_to(x, {3, 1})), ref_sum(values_of(x), x.shape(), {0, 2}, false, &ignored), 1e-14,
               1e-15, "sum_to [3, 1]");
  EXPECT_EQ(ops::sum_to(x, {3, 1}).shape(), (Shape{3, 1}));
  EXPECT_EQ(ops::sum_to(x, {1, 1, 4}).shape(), (Shape{1, 1, 4}));
  Tensor y = uniform({2, 3, 4}, -1, 1, 4);
  y.set_requires_grad();
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::sum_to(in[0], {3, 1}); }, {y});
  expect_error([&] { ops::sum_to(x, {2, 4}); }, {"sum_to", "[2, 3, 4]", "[2, 4]"});
}

TEST(ReduceSum, RejectsBadInputs) {
  const Tensor x = zeros({2, 3, 4});
  expect_error([&] { ops::sum(x, {3}); }, {"sum", "3", "[2, 3, 4]"});
  expect_error([&] { ops::sum(x, {-4}); }, {"sum", "[2, 3, 4]"});
  expect_error([&] { ops::sum(x, {1, -2}); }, {"sum", "repeated", "[2, 3, 4]"});
  expect_error([&] { ops::mean(x, {5}); }, {"mean", "[2, 3, 4]"});
  expect_error([] { ops::sum(zeros({2}, DType::i64)); }, {"sum", "[2]", "i64"});
}

// Brute force along one dim: first maximum, NaN wins.
void ref_max(const std::vector<double>& x, const Shape& shape, std::int64_t d, std::vector<double>* values,
             std::vector<double>* indices) {
  Shape keep = shape;
  keep[d] = 1;
  values->assign(static_cast<std::size_t>(shape_numel(keep)), 0);
  indices->assign(values->size(), -1);
  for (std::size_t i = 0; i < x.size(); ++i) {
    Shape idx = unravel(static_cast<std::int64_t>(i), shape);
    const std::int64_t j = idx[d];
    idx[d] = 0;
    std::int64_t flat = 0;
    for (std::size_t k = 0; k < shape.size(); ++k) flat = flat * keep[k] + idx[k];
    double& best = (*values)[flat];
    double& at = (*indices)[flat];
    if (at < 0 || (!std::isnan(best) && (x[i] > best || std::isnan(x[i])))) {
      best = x[i];
      at = static_cast<double>(j);
    }
  }
}

TEST(ReduceMax, ValuesAndIndicesMatchBruteForce) {
  // Few distinct values, so rows contain ties: the index must be the first maximum.
  std::vector<double> v(2 * 3 * 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 4) - 1.0;
  const Tensor x = tensor(v, {2, 3, 5});
  for (std::int64_t d = -3; d < 3; ++d) {
    for (bool keepdim : {false, true}) {
      std::vector<double> ev, ei;
      const std::int64_t dd = (d + 3) % 3;
      ref_max(v, x.shape(), dd, &ev, &ei);
      Shape shape = x.shape();
      if (keepdim) shape[dd] = 1;
      else shape.erase(shape.begin() + dd);
      const Tensor m = ops::max(x, d, keepdim), a = ops::argmax(x, d, keepdim);
      EXPECT_EQ(m.shape(), shape);
      EXPECT_EQ(a.shape(), shape);
      EXPECT_EQ(a.dtype(), DType::i64);
      expect_close(values_of(m), ev, 0, 0, "max values");
      expect_close(values_of(a), ei, 0, 0, "argmax");
      // The same through a transposed (non-contiguous) view, and in bf16 (exact: max picks an element).
      const Tensor xt = x.transpose(0, 2).contiguous().transpose(0, 2);
      expect_close(values_of(ops::argmax(xt, d, keepdim)), ei, 0, 0, "argmax of a view");
      expect_close(values_of(ops::max(x.to(DType::bf16), d, keepdim)), ev, 0, 0, "max bf16");
    }
  }
}

TEST(ReduceMax, NaNPropagatesAndScalarsWork) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = tensor(std::vector<double>{1, nan, 5, 2, 3, 4}, {2, 3});
  expect_close(values_of(ops::max(x, 1)), {nan, 4}, 0, 0, "max with NaN");
  expect_close(values_of(ops::argmax(x, 1)), {1, 2}, 0, 0, "argmax with NaN");
  const Tensor s = tensor(std::vector<double>{-3.0}, {});
  EXPECT_EQ(ops::max(s, 0).item(), -3.0);
  EXPECT_EQ(ops::argmax(s, -1).item(), 0.0);
}

TEST(ReduceMax, GradientGoesToTheFirstMaximum) {
  Tensor x = tensor(std::vector<double>{1, 3, 3, 2, 7, 7, 7, 0}, {2, 4});
  x.set_requires_grad();
  ops::max(x, 1).backward(tensor(std::vector<double>{10, 20}, {2}));
  expect_close(values_of(x.grad()), {0, 10, 0, 0, 20, 0, 0, 0}, 0, 0, "max gradient with ties");
}

TEST(ReduceMax, GradientsMatchFiniteDifferences) {
  for (std::int64_t d = 0; d < 3; ++d) {
    for (bool keepdim : {false, true}) {
      Tensor x = normal({3, 4, 5}, 5 + static_cast<std::uint64_t>(d));
      x.set_requires_grad();
      expect_gradients_match([d, keepdim](const std::vector<Tensor>& in) { return ops::max(in[0], d, keepdim); }, {x});
      expect_gradients_match(
          [d, keepdim](const std::vector<Tensor>& in) { return ops::max(in[0].permute({2, 0, 1}), d, keepdim); }, {x});
    }
  }
}

TEST(ReduceMax, RejectsBadInputs) {
  expect_error([] { ops::max(zeros({2, 3}), 2); }, {"max", "2", "[2, 3]"});
  expect_error([] { ops::argmax(zeros({2, 3}), -3); }, {"argmax", "[2, 3]"});
  expect_error([] { ops::max(zeros({2, 0}), 1); }, {"max", "size 0", "[2, 0]"});
  expect_error([] { ops::max(zeros({2}, DType::i32), 0); }, {"max", "[2]", "i32"});
  EXPECT_FALSE(ops::argmax(normal({3}, 7).set_requires_grad(), 0).requires_grad());
}

// ---- views ----

TEST(Views, ValuesMatchIndexArithmetic) {
  const Tensor x = uniform({2, 3, 4}, -1, 1, 10);
  const std::vector<double> v = values_of(x);
  auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) { return v[(i * 3 + j) * 4 + k]; };
  const std::vector<double> p = values_of(x.permute({2, 0, 1}));  // [4, 2, 3]
  const std::vector<double> s = values_of(x.slice(2, 1, 4, 2));   // [2, 3, 2]: k = 1, 3
  const std::vector<double> sel = values_of(x.select(1, -1));     // [2, 4]: j = 2
  const std::vector<double> e = values_of(x.narrow(1, 1, 1).expand({5, 2, 1, 4}).contiguous());
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t k = 0; k < 4; ++k) {
        EXPECT_EQ(p[(k * 2 + i) * 3 + j], at(i, j, k));
        if (k % 2 == 1) {
          EXPECT_EQ(s[(i * 3 + j) * 2 + k / 2], at(i, j, k));
        }
        if (j == 2) {
          EXPECT_EQ(sel[i * 4 + k], at(i, j, k));
        }
      }
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t k = 0; k < 4; ++k) EXPECT_EQ(e[(r * 2 + i) * 4 + k], at(i, 1, k));
  EXPECT_TRUE(x.transpose(0, 2).shares_storage_with(x));
  EXPECT_EQ(x.view({-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_EQ(x.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(x.narrow(0, 1, 1).squeeze().shape(), (Shape{3, 4}));
  EXPECT_EQ(x.narrow(0, 1, 1).squeeze(0).shape(), (Shape{3, 4}));
  EXPECT_EQ(x.squeeze(1).shape(), x.shape());
}

TEST(Views, ScalarsReshapeAndUnsqueeze) {
  const Tensor s = ops::sum(uniform({3}, -1, 1, 11));  // shape []
  EXPECT_EQ(s.reshape({1}).shape(), (Shape{1}));
  EXPECT_EQ(s.view({1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(s.unsqueeze(0).shape(), (Shape{1}));
  EXPECT_EQ(s.flatten().shape(), (Shape{1}));
  EXPECT_EQ(s.reshape({1}).item(), s.item());
}

struct ViewCase {
  std::string name;
  std::function<Tensor(const Tensor&)> f;  // applied to an input of shape [2, 3, 4]
};

std::vector<ViewCase> view_cases() {
  return {
      {"view", [](const Tensor& x) { return x.view({6, 4}); }},
      {"view_infer", [](const Tensor& x) { return x.view({-1, 2, 2}); }},
      {"reshape_copy", [](const Tensor& x) { return x.transpose(0, 1).reshape({12, 2}); }},  // not viewable
      {"flatten", [](const Tensor& x) { return x.flatten(0, 1); }},
      {"transpose", [](const Tensor& x) { return x.transpose(0, 2); }},
      {"t", [](const Tensor& x) { return x.select(0, 1).t(); }},
      {"permute", [](const Tensor& x) { return x.permute({1, 2, 0}); }},
      {"slice_step", [](const Tensor& x) { return x.slice(2, 0, 4, 3); }},
      {"slice_negative", [](const Tensor& x) { return x.slice(1, -2, 3); }},
      {"narrow", [](const Tensor& x) { return x.narrow(1, 1, 2); }},
      {"select", [](const Tensor& x) { return x.select(2, -1); }},
      {"expand", [](const Tensor& x) { return x.narrow(1, 0, 1).expand({3, 2, 5, 4}); }},
      {"squeeze", [](const Tensor& x) { return x.narrow(0, 0, 1).squeeze(0); }},
      {"squeeze_all", [](const Tensor& x) { return x.narrow(1, 2, 1).squeeze(); }},
      {"unsqueeze", [](const Tensor& x) { return x.unsqueeze(1); }},
      {"contiguous", [](const Tensor& x) { return x.permute({2, 1, 0}).contiguous(); }},
      {"clone", [](const Tensor& x) { return x.clone(); }},
      {"chain", [](const Tensor& x) { return x.transpose(1, 2).slice(0, 1, 2).reshape({-1}).view({2, 2, 3}); }},
  };
}

TEST(Views, GradientsMatchFiniteDifferences) {
  for (const auto& c : view_cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = uniform({2, 3, 4}, -1, 1, 12);
    x.set_requires_grad();
    // A nonlinear op after the view makes the check depend on which element went where.
    expect_gradients_match([&c](const std::vector<Tensor>& in) { return ops::exp(c.f(in[0])) * 0.5; }, {x});
    // The same view used twice (gradients must accumulate).
    expect_gradients_match([&c](const std::vector<Tensor>& in) { return c.f(in[0]) * c.f(in[0]); }, {x});
  }
}

TEST(Views, DtypeConversionGradient) {
  Tensor x = uniform({3, 2}, -1, 1, 13);
  x.set_requires_grad();
  const Tensor y = x.to(DType::f32);
  const Tensor g = uniform({3, 2}, -1, 1, 14, DType::f32);
  y.backward(g);
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_EQ(values_of(x.grad()), values_of(g));  // f32 -> f64 is exact
  EXPECT_EQ(x.to(DType::f64).impl_ptr(), x.impl_ptr());  // same dtype: no copy, no node
}

TEST(Views, RejectsBadInputs) {
  const Tensor x = zeros({2, 3, 4});
  expect_error([&] { x.transpose(0, 1).view({6, 4}); }, {"view", "[3, 2, 4]", "[6, 4]"});
  expect_error([&] { x.view({5, -1}); }, {"view", "[5, -1]"});
  expect_error([&] { x.reshape({-1, -1}); }, {"reshape"});
  expect_error([&] { x.transpose(0, 3); }, {"transpose", "3"});
  expect_error([&] { x.permute({0, 0, 1}); }, {"permute", "repeated"});
  expect_error([&] { x.permute({0, 1}); }, {"permute", "rank"});
  expect_error([&] { x.narrow(2, 3, 2); }, {"narrow", "[2, 3, 4]"});
  expect_error([&] { x.select(1, 3); }, {"select", "3"});
  expect_error([&] { x.expand({2, 5, 4}); }, {"expand", "[2, 3, 4]", "[2, 5, 4]"});
  expect_error([&] { x.slice(0, 0, 2, 0); }, {"slice", "step"});
}

// ---- concat, split, chunk ----

TEST(ShapeConcat, ValuesMatchPieces) {
  const Tensor a = uniform({2, 1, 3}, -1, 1, 20), b = uniform({2, 4, 3}, -1, 1, 21),
               c = uniform({3, 2}, -1, 1, 22).t().unsqueeze(0).expand({2, 2, 3});  // non-contiguous
  for (std::int64_t d : {1, -2}) {
    const Tensor y = ops::concat({a, b, c}, d);
    ASSERT_EQ(y.shape(), (Shape{2, 7, 3}));
    const std::vector<double> vy = values_of(y), va = values_of(a), vb = values_of(b), vc = values_of(c);
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 7; ++j)
        for (std::int64_t k = 0; k < 3; ++k) {
          const double expected = j < 1 ? va[(i * 1 + j) * 3 + k]
                                  : j < 5 ? vb[(i * 4 + j - 1) * 3 + k]
                                          : vc[(i * 2 + j - 5) * 3 + k];
          EXPECT_EQ(vy[(i * 7 + j) * 3 + k], expected);
        }
  }
  const Tensor z = ops::concat({a.to(DType::bf16), a.to(DType::bf16)}, 0);
  EXPECT_EQ(z.dtype(), DType::bf16);
  EXPECT_EQ(z.shape(), (Shape{4, 1, 3}));
  EXPECT_EQ(ops::concat({a, zeros({2, 0, 3}, DType::f64)}, 1).shape(), a.shape());
}

TEST(ShapeConcat, Gradients) {
  Tensor a = uniform({2, 3}, -1, 1, 23), b = uniform({2, 2}, -1, 1, 24);
  const Tensor constant = uniform({2, 1}, -1, 1, 25);
  a.set_requires_grad();
  b.set_requires_grad();
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::tanh(ops::concat({in[0], in[2], in[1].t().t()}, 1)); },
      {a, b, constant});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::concat({in[0].t(), in[1], in[0].t()}, 0); },
                         {a, b});
}

TEST(ShapeSplit, ViewsOfConsecutivePieces) {
  const Tensor x = uniform({6, 2}, -1, 1, 26);
  const std::vector<Tensor> parts = ops::split(x, {1, 3, 0, 2}, 0);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[1].shape(), (Shape{3, 2}));
  EXPECT_EQ(parts[2].shape(), (Shape{0, 2}));
  EXPECT_TRUE(parts[3].shares_storage_with(x));
  const std::vector<double> vx = values_of(x);
  EXPECT_EQ(values_of(parts[3]), std::vector<double>(vx.begin() + 8, vx.end()));
  const std::vector<Tensor> cols = ops::split(x, {1, 1}, -1);
  EXPECT_EQ(cols[1].shape(), (Shape{6, 1}));
  EXPECT_EQ(values_of(cols[1])[2], vx[5]);

  auto sizes = [](const std::vector<Tensor>& ts, std::int64_t d) {
    Shape s;
    for (const auto& t : ts) s.push_back(t.shape()[d]);
    return s;
  };
  EXPECT_EQ(sizes(ops::chunk(zeros({10}), 3, 0), 0), (Shape{4, 4, 2}));
  EXPECT_EQ(sizes(ops::chunk(zeros({6, 2}), 3, 0), 0), (Shape{2, 2, 2}));
  EXPECT_EQ(sizes(ops::chunk(zeros({2, 2}), 3, 0), 0), (Shape{1, 1}));
  EXPECT_EQ(sizes(ops::chunk(zeros({3, 5}), 2, -1), 1), (Shape{3, 2}));
}

TEST(ShapeSplit, GradientsFlowThroughTheViews) {
  Tensor x = uniform({5, 3}, -1, 1, 27);
  x.set_requires_grad();
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        const auto p = ops::split(in[0], {2, 3}, 0);
        return ops::concat({ops::exp(p[1]), p[0] * p[0]}, 0);
      },
      {x});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        const auto q = ops::chunk(in[0], 3, 1);  // like splitting a fused qkv projection
        return q[0] * q[1] + q[2];
      },
      {x});
}

TEST(ShapeOps, RejectBadInputs) {
  const Tensor a = zeros({2, 3}), b = zeros({2, 4});
  expect_error([&] { ops::concat({a, b}, 0); }, {"concat", "[2, 4]", "[2, 3]"});
  expect_error([&] { ops::concat({a, zeros({2, 3, 1})}, 1); }, {"concat", "[2, 3, 1]"});
  expect_error([&] { ops::concat({a, zeros({2, 3}, DType::f64)}, 0); }, {"concat", "f32", "f64"});
  expect_error([&] { ops::concat({a, b}, 2); }, {"concat", "2", "[2, 3]"});
  expect_error([] { ops::concat({}, 0); }, {"concat"});
  expect_error([&] { ops::split(a, {1, 1}, 1); }, {"split", "[1, 1]", "[2, 3]"});
  expect_error([&] { ops::split(a, {4, -1}, 1); }, {"split", "-1"});
  expect_error([&] { ops::split(a, {3}, -3); }, {"split", "[2, 3]"});
  expect_error([&] { ops::chunk(a, 0, 0); }, {"chunk", "[2, 3]"});
}

}  // namespace
}  // namespace memtrain
