// The conveniences a user expects (issue 27, point 6): ops::mse_loss / ops::l1_loss, ops::index_select and
// data::TensorDataset. Reference values are computed here in double from the inputs' values (hand loops),
// never through the ops under test; gradients are checked by central differences (gradcheck.h).
#include "gradcheck.h"
#include "meta_footprint.h"
#include "op_test_util.h"

#include "memtrain/amp/autocast.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/tensor.h"
#include "memtrain/data/loader.h"
#include "memtrain/data/tensor_dataset.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/ops/shape.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using ops::Reduction;
using testing::expect_close;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::normal;
using testing::values_of;

using LossFn = Tensor (*)(const Tensor&, const Tensor&, Reduction);

struct LossCase {
  const char* name;
  LossFn fn;
  double (*per_element)(double);  // of the difference input - target
};

const LossCase kLosses[] = {
    {"mse_loss", &ops::mse_loss, [](double d) { return d * d; }},
    {"l1_loss", &ops::l1_loss, [](double d) { return std::abs(d); }},
};

const Reduction kReductions[] = {Reduction::mean, Reduction::sum, Reduction::none};

const char* reduction_name(Reduction r) {
  return r == Reduction::mean ? "mean" : r == Reduction::sum ? "sum" : "none";
}

// The loss of `input` against `target` in double, from their values.
std::vector<double> reference_loss(const LossCase& loss, const Tensor& input, const Tensor& target, Reduction r) {
  const std::vector<double> x = values_of(input), t = values_of(target);
  std::vector<double> per(x.size());
  double total = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    per[i] = loss.per_element(x[i] - t[i]);
    total += per[i];
  }
  if (r == Reduction::none) return per;
  return {r == Reduction::sum ? total : total / static_cast<double>(x.size())};
}

// ============================== mse_loss, l1_loss ==============================

TEST(UserOpsLoss, ForwardMatchesFloat64ReferenceForEveryReduction) {
  for (const DType dtype : {DType::f32, DType::f64}) {
    const Tensor input = normal({3, 4, 5}, 1, dtype), target = normal({3, 4, 5}, 2, dtype);
    // f32: the elementwise results are rounded once each and the reduction accumulates 60 of them.
    const double rtol = dtype == DType::f32 ? 1e-5 : 1e-12;
    for (const LossCase& loss : kLosses) {
      for (const Reduction r : kReductions) {
        const std::string what =
            std::string(loss.name) + " " + reduction_name(r) + " " + std::string(dtype_name(dtype));
        const Tensor y = loss.fn(input, target, r);
        EXPECT_EQ(y.dtype(), dtype) << what;
        EXPECT_EQ(y.shape(), r == Reduction::none ? input.shape() : Shape{}) << what;
        expect_close(values_of(y), reference_loss(loss, input, target, r), rtol, 1e-7, what);
      }
    }
  }
}

TEST(UserOpsLoss, DefaultReductionIsMean) {
  const Tensor input = normal({4, 2}, 3), target = normal({4, 2}, 4);
  // The defaults against the mean reference (8 elements: a sum would be 8 times as large).
  EXPECT_NEAR(ops::mse_loss(input, target).item(), reference_loss(kLosses[0], input, target, Reduction::mean)[0],
              1e-12);
  EXPECT_NEAR(ops::l1_loss(input, target).item(), reference_loss(kLosses[1], input, target, Reduction::mean)[0],
              1e-12);
}

TEST(UserOpsLoss, GradientsOfInputAndTargetMatchFiniteDifferences) {
  // Random normal values keep input - target away from l1's kink at 0.
  Tensor input = normal({3, 4}, 5), target = normal({3, 4}, 6);
  input.set_requires_grad(true);
  target.set_requires_grad(true);  // as in PyTorch, a target that requires grad gets one
  for (const LossCase& loss : kLosses) {
    for (const Reduction r : kReductions) {
      SCOPED_TRACE(std::string(loss.name) + " " + reduction_name(r));
      expect_gradients_match([&](const std::vector<Tensor>& x) { return loss.fn(x[0], x[1], r); },
                             {input, target});
    }
  }
}

TEST(UserOpsLoss, TargetWithoutRequiresGradGetsNoGradient) {
  Tensor input = normal({5}, 7);
  input.set_requires_grad(true);
  const Tensor target = normal({5}, 8);
  for (const LossCase& loss : kLosses) {
    input.set_grad(Tensor());
    loss.fn(input, target, Reduction::sum).backward();
    EXPECT_TRUE(input.grad().defined()) << loss.name;
    EXPECT_FALSE(target.grad().defined()) << loss.name;
  }
}

TEST(UserOpsLoss, ShapeAndDtypeMismatchesNameTheOpAndBothOperands) {
  const Tensor a = zeros({2, 3}), b = zeros({3});
  expect_error([&] { ops::mse_loss(a, b); }, {"mse_loss", "[2, 3]", "[3]", "same shape"});
  expect_error([&] { ops::l1_loss(a, b); }, {"l1_loss", "[2, 3]", "[3]", "same shape"});
  // Broadcastable shapes are refused too: [4, 1] against [4] would silently give a [4, 4] loss.
  expect_error([&] { ops::mse_loss(zeros({4, 1}), zeros({4})); }, {"mse_loss", "[4, 1]", "[4]"});
  expect_error([&] { ops::mse_loss(zeros({2}), zeros({2}, DType::f64)); }, {"mse_loss", "f32", "f64"});
  expect_error([&] { ops::l1_loss(zeros({2}, DType::bf16), zeros({2})); }, {"l1_loss", "bf16", "f32"});
  expect_error([&] { ops::mse_loss(zeros({2}, DType::i64), zeros({2}, DType::i64)); }, {"mse_loss", "floating"});
}

TEST(UserOpsLoss, RunsInF32UnderAutocast) {
  const Tensor input = normal({6}, 9, DType::bf16), target = normal({6}, 10, DType::f32);
  amp::Autocast autocast(DType::bf16);
  for (const LossCase& loss : kLosses) {
    const Tensor y = loss.fn(input, target, Reduction::mean);
    EXPECT_EQ(y.dtype(), DType::f32) << loss.name;
    expect_close(values_of(y), reference_loss(loss, input, target, Reduction::mean), 1e-5, 1e-7, loss.name);
  }
}

TEST(UserOpsLoss, MetaGivesTheShapesAndTheCpuBytes) {
  for (const LossCase& loss : kLosses) {
    for (const Reduction r : kReductions) {
      const std::string what = std::string(loss.name) + " " + reduction_name(r);
      test_support::expect_same_footprint(what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor input = rand({64, 8}, DType::f32, dev).set_requires_grad(true);
        const Tensor target = rand({64, 8}, DType::f32, dev);
        const Tensor y = loss.fn(input, target, r);
        EXPECT_EQ(y.device(), dev) << what;
        EXPECT_EQ(y.shape(), (r == Reduction::none ? Shape{64, 8} : Shape{})) << what;
        CategoryGuard grads(MemoryCategory::gradients);
        y.backward(ones(y.shape(), y.dtype(), dev));
        EXPECT_EQ(input.grad().shape(), (Shape{64, 8})) << what;
      });
    }
  }
}

// ============================== index_select ==============================

// out[..., j, ...] = x[..., indices[j], ...] along dim d, by a loop over out's flat positions.
std::vector<double> reference_select(const Tensor& x, std::int64_t d, const std::vector<std::int64_t>& indices) {
  const std::vector<double> xv = values_of(x);
  Shape out_shape = x.shape();
  out_shape[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(indices.size());
  const Shape in_strides = contiguous_strides(x.shape());
  std::vector<double> out(static_cast<std::size_t>(shape_numel(out_shape)));
  for (std::int64_t i = 0; i < shape_numel(out_shape); ++i) {
    Shape idx = testing::unravel(i, out_shape);
    idx[static_cast<std::size_t>(d)] = indices[static_cast<std::size_t>(idx[static_cast<std::size_t>(d)])];
    std::int64_t flat = 0;
    for (std::size_t k = 0; k < idx.size(); ++k) flat += idx[k] * in_strides[k];
    out[static_cast<std::size_t>(i)] = xv[static_cast<std::size_t>(flat)];
  }
  return out;
}

Tensor index_tensor(const std::vector<std::int64_t>& v, DType dtype) {
  return tensor(v, {static_cast<std::int64_t>(v.size())}).to(dtype);
}

TEST(UserOpsIndexSelect, ForwardOnDimsFirstMiddleLastMatchesHandLoop) {
  const Tensor x = normal({3, 4, 5}, 11);
  struct Case {
    std::int64_t dim, ref_dim;
    std::vector<std::int64_t> indices;
    DType index_dtype;
  };
  const Case cases[] = {
      {0, 0, {2, 0, 2}, DType::i64},
      {1, 1, {3, 1, 1, 0, 2}, DType::i32},
      {2, 2, {4}, DType::i64},
      {-1, 2, {0, 4, 3}, DType::i32},  // negative dims count from the end
  };
  for (const Case& c : cases) {
    const std::string what = "dim " + std::to_string(c.dim);
    const Tensor y = ops::index_select(x, c.dim, index_tensor(c.indices, c.index_dtype));
    Shape expected_shape = x.shape();
    expected_shape[static_cast<std::size_t>(c.ref_dim)] = static_cast<std::int64_t>(c.indices.size());
    EXPECT_EQ(y.shape(), expected_shape) << what;
    EXPECT_EQ(y.dtype(), DType::f64) << what;
    EXPECT_EQ(values_of(y), reference_select(x, c.ref_dim, c.indices)) << what;
  }
  // A non-contiguous input (a transposed view) selects by its logical layout.
  const Tensor xt = x.transpose(0, 2);  // (5, 4, 3)
  const std::vector<std::int64_t> idx = {2, 2, 0};
  EXPECT_EQ(values_of(ops::index_select(xt, 2, index_tensor(idx, DType::i64))),
            reference_select(xt.contiguous(), 2, idx));
  // f32 and an empty index vector.
  const Tensor xf = x.to(DType::f32);
  const Tensor yf = ops::index_select(xf, 1, index_tensor({3, 0}, DType::i64));
  EXPECT_EQ(yf.dtype(), DType::f32);
  EXPECT_EQ(values_of(yf), reference_select(xf, 1, {3, 0}));
  EXPECT_EQ(ops::index_select(x, 1, index_tensor({}, DType::i64)).shape(), (Shape{3, 0, 5}));
}

TEST(UserOpsIndexSelect, IntegerInputsAreCopied) {
  const Tensor x = arange(12, DType::i64).view({3, 4});
  const Tensor y = ops::index_select(x, 1, index_tensor({3, 3, 0}, DType::i32));
  EXPECT_EQ(y.dtype(), DType::i64);
  EXPECT_EQ(y.shape(), (Shape{3, 3}));
  EXPECT_EQ(values_of(y), reference_select(x, 1, {3, 3, 0}));
}

TEST(UserOpsIndexSelect, BackwardAccumulatesRepeatedIndices) {
  // x [4, 3]; rows 1 (three times) and 3 selected along dim 0, columns 2, 0, 2 along dim 1.
  for (const std::int64_t dim : {0, 1}) {
    const std::vector<std::int64_t> idx = dim == 0 ? std::vector<std::int64_t>{1, 3, 1, 1}
                                                   : std::vector<std::int64_t>{2, 0, 2};
    Tensor x = normal({4, 3}, 12);
    x.set_requires_grad(true);
    const Tensor y = ops::index_select(x, dim, index_tensor(idx, DType::i64));
    const Tensor g = normal(y.shape(), 13);
    y.backward(g);
    // dx[r, c] = sum over the output positions that read x[r, c] of g there.
    const std::vector<double> gv = values_of(g);
    std::vector<double> expected(12, 0.0);
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      Shape pos = testing::unravel(i, g.shape());
      pos[static_cast<std::size_t>(dim)] = idx[static_cast<std::size_t>(pos[static_cast<std::size_t>(dim)])];
      expected[static_cast<std::size_t>(pos[0] * 3 + pos[1])] += gv[static_cast<std::size_t>(i)];
    }
    ASSERT_TRUE(x.grad().defined()) << "dim " << dim;
    EXPECT_EQ(x.grad().shape(), x.shape()) << "dim " << dim;
    expect_close(values_of(x.grad()), expected, 1e-12, 1e-12, "dim " + std::to_string(dim));
  }
}

TEST(UserOpsIndexSelect, GradientsMatchFiniteDifferencesOnEveryDim) {
  Tensor x = normal({3, 4, 2}, 14);
  x.set_requires_grad(true);
  const std::vector<std::vector<std::int64_t>> per_dim = {{0, 2, 0}, {3, 3, 1}, {1, 0, 1, 1}};
  for (std::int64_t d = 0; d < 3; ++d) {
    SCOPED_TRACE("dim " + std::to_string(d));
    const Tensor idx = index_tensor(per_dim[static_cast<std::size_t>(d)], DType::i32);
    expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::index_select(in[0], d, idx); }, {x});
  }
}

TEST(UserOpsIndexSelect, OutOfRangeAndBadArgumentsAreRefused) {
  const Tensor x = zeros({3, 5});
  expect_error([&] { ops::index_select(x, 1, index_tensor({0, 7, 2}, DType::i64)); },
               {"index_select", "index 7", "position 1", "size 5"});
  expect_error([&] { ops::index_select(x, 0, index_tensor({-1}, DType::i32)); },
               {"index_select", "index -1", "position 0", "size 3"});
  // Integer inputs take the same check.
  expect_error([&] { ops::index_select(zeros({3}, DType::i64), 0, index_tensor({3}, DType::i64)); },
               {"index_select", "index 3", "size 3"});
  expect_error([&] { ops::index_select(x, 2, index_tensor({0}, DType::i64)); }, {"index_select", "dimension 2"});
  expect_error([&] { ops::index_select(x, 0, zeros({1, 1}, DType::i64)); }, {"index_select", "1-D", "[1, 1]"});
  expect_error([&] { ops::index_select(x, 0, zeros({1})); }, {"index_select", "i32 or i64", "f32"});
}

TEST(UserOpsIndexSelect, KeepsTheInputDtypeUnderAutocast) {
  const Tensor x = normal({4, 3}, 15, DType::f32);
  amp::Autocast autocast(DType::bf16);
  const Tensor y = ops::index_select(x, 0, index_tensor({1, 2}, DType::i64));
  EXPECT_EQ(y.dtype(), DType::f32);  // embedding alone would give bf16 here
  EXPECT_EQ(values_of(y), reference_select(x, 0, {1, 2}));
}

TEST(UserOpsIndexSelect, MetaGivesTheShapesAndTheCpuBytes) {
  for (const std::int64_t dim : {0, 1, 2}) {
    const std::string what = "index_select dim " + std::to_string(dim);
    test_support::expect_same_footprint(what, [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      Tensor x = rand({6, 5, 4}, DType::f32, dev).set_requires_grad(true);
      const Tensor idx = zeros({3}, DType::i64, dev);
      const Tensor y = ops::index_select(x, dim, idx);
      Shape expected = x.shape();
      expected[static_cast<std::size_t>(dim)] = 3;
      EXPECT_EQ(y.shape(), expected) << what;
      EXPECT_EQ(y.device(), dev) << what;
      CategoryGuard grads(MemoryCategory::gradients);
      y.backward(ones(y.shape(), y.dtype(), dev));
      EXPECT_EQ(x.grad().shape(), x.shape()) << what;
    });
  }
}

// ============================== TensorDataset ==============================

// inputs [10, 2, 3] f32 where element k of sample i is 100 i + k; targets [10] i64 = 7 i.
std::shared_ptr<data::TensorDataset> make_dataset() {
  std::vector<float> in(60);
  for (std::size_t i = 0; i < 10; ++i)
    for (std::size_t k = 0; k < 6; ++k) in[i * 6 + k] = static_cast<float>(100 * i + k);
  std::vector<std::int64_t> tg(10);
  for (std::size_t i = 0; i < 10; ++i) tg[i] = static_cast<std::int64_t>(7 * i);
  return std::make_shared<data::TensorDataset>(tensor(in, {10, 2, 3}), tensor(tg, {10}));
}

void expect_rows(const data::Batch& b, const std::vector<std::int64_t>& indices, const std::string& what) {
  const auto n = static_cast<std::int64_t>(indices.size());
  ASSERT_EQ(b.inputs.shape(), (Shape{n, 2, 3})) << what;
  ASSERT_EQ(b.targets.shape(), (Shape{n})) << what;
  EXPECT_EQ(b.inputs.dtype(), DType::f32) << what;
  EXPECT_EQ(b.targets.dtype(), DType::i64) << what;
  EXPECT_EQ(b.samples, n) << what;
  EXPECT_EQ(b.targets_count, n) << what;
  const std::vector<double> in = values_of(b.inputs), tg = values_of(b.targets);
  for (std::size_t r = 0; r < indices.size(); ++r) {
    for (std::size_t k = 0; k < 6; ++k)
      EXPECT_EQ(in[r * 6 + k], static_cast<double>(100 * indices[r] + static_cast<std::int64_t>(k))) << what;
    EXPECT_EQ(tg[r], static_cast<double>(7 * indices[r])) << what;
  }
}

TEST(UserOpsTensorDataset, CollateGathersTheRowsAndTargets) {
  const auto ds = make_dataset();
  EXPECT_EQ(ds->size(), 10);
  expect_rows(ds->collate({3, 0, 9, 3}), {3, 0, 9, 3}, "collate");
  const std::string d = ds->describe();
  EXPECT_NE(d.find("TensorDataset"), std::string::npos) << d;
  EXPECT_NE(d.find("10 samples"), std::string::npos) << d;
  EXPECT_NE(d.find("[10, 2, 3] f32"), std::string::npos) << d;
}

TEST(UserOpsTensorDataset, MultiElementTargetsCountEveryElement) {
  const data::TensorDataset ds(arange(8, DType::f64).view({4, 2}), arange(12, DType::i32).view({4, 3}));
  const data::Batch b = ds.collate({2, 1});
  EXPECT_EQ(b.targets.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.targets_count, 6);
  EXPECT_EQ(values_of(b.inputs), (std::vector<double>{4, 5, 2, 3}));
  EXPECT_EQ(values_of(b.targets), (std::vector<double>{6, 7, 8, 3, 4, 5}));
}

TEST(UserOpsTensorDataset, WorksThroughTheLoader) {
  const auto ds = make_dataset();
  data::LoaderOptions o;
  o.batch_size = 3;
  o.seed = 5;
  o.prefetch = 2;  // collated on the loader's thread
  data::Loader loader(ds, o);
  std::set<std::int64_t> seen;
  for (int k = 0; k < loader.batches_per_epoch(); ++k) {
    const std::vector<std::int64_t> idx = loader.batch_indices({0, k});
    const data::Batch b = loader.next();
    expect_rows(b, idx, "batch " + std::to_string(k));
    seen.insert(idx.begin(), idx.end());
  }
  EXPECT_EQ(seen.size(), 9u);  // 3 full batches of distinct samples out of 10 (drop_last)
}

TEST(UserOpsTensorDataset, BatchBytesAreCountedAsData) {
  const auto ds = make_dataset();
  const std::size_t before = memory_stats()[MemoryCategory::data].live_bytes;
  const data::Batch b = ds->collate({1, 2, 3, 4});  // no guard here: collate must set the category itself
  const std::size_t after = memory_stats()[MemoryCategory::data].live_bytes;
  EXPECT_EQ(after - before, b.inputs.nbytes() + b.targets.nbytes());
}

TEST(UserOpsTensorDataset, BadShapesAndIndicesAreRefused) {
  expect_error([] { data::TensorDataset(zeros({5, 2}), zeros({4})); }, {"TensorDataset", "[5, 2]", "[4]"});
  expect_error([] { data::TensorDataset(zeros({}), zeros({1})); }, {"TensorDataset", "[]"});
  const auto ds = make_dataset();
  expect_error([&] { ds->collate({0, 10}); }, {"TensorDataset::collate", "10", "position 1", "[0, 10)"});
  expect_error([&] { ds->collate({-1}); }, {"TensorDataset::collate", "-1"});
  expect_error([&] { ds->collate({}); }, {"TensorDataset::collate", "no sample"});
}

}  // namespace
}  // namespace memtrain
