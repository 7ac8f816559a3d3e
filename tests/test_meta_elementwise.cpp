// The elementwise, reduction and selection ops on the meta device: each must allocate, per memory
// category, exactly what it allocates on the CPU, forward and backward (src/cpu/elementwise.cpp).
#include <gtest/gtest.h>

#include "meta_footprint.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/reduce.h"

#include <array>
#include <functional>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using test_support::expect_same_footprint;
using test_support::Footprint;

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

// Forward and backward of a one-input op over a contiguous input and over a transposed view.
void expect_unary_footprints(const std::string& name, const std::function<Tensor(const Tensor&)>& op) {
  for (const DType dtype : kDtypes) {
    for (const bool view : {false, true}) {
      const std::string what = name + " " + std::string(dtype_name(dtype)) + (view ? " view" : "");
      expect_same_footprint(what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        // 3000 x 5 elements: several narrow blocks of 2048 and a partial one.
        Tensor x = rand({3000, 5}, dtype, dev).set_requires_grad(true);
        const Tensor in = view ? x.t() : x;
        const Tensor y = op(in);
        EXPECT_EQ(y.dtype(), dtype) << what;
        EXPECT_EQ(y.device(), dev) << what;
        CategoryGuard grads(MemoryCategory::gradients);
        y.backward(ones(y.shape(), y.dtype(), dev));
        EXPECT_EQ(x.grad().dtype(), dtype) << what;
      });
    }
  }
}

TEST(MetaElementwise, UnaryOpsMatchCpuBytesForwardAndBackward) {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops_list = {
      {"neg", [](const Tensor& t) { return ops::neg(t); }},
      {"exp", [](const Tensor& t) { return ops::exp(t); }},
      {"log", [](const Tensor& t) { return ops::log(t); }},
      {"sqrt", [](const Tensor& t) { return ops::sqrt(t); }},
      {"rsqrt", [](const Tensor& t) { return ops::rsqrt(t); }},
      {"tanh", [](const Tensor& t) { return ops::tanh(t); }},
      {"sigmoid", [](const Tensor& t) { return ops::sigmoid(t); }},
      {"relu", [](const Tensor& t) { return ops::relu(t); }},
      {"silu", [](const Tensor& t) { return ops::silu(t); }},
      {"abs", [](const Tensor& t) { return ops::abs(t); }},
      {"pow", [](const Tensor& t) { return ops::pow(t, 3.0); }},
      {"clamp", [](const Tensor& t) { return ops::clamp(t, 0.2, 0.7); }},
      {"gelu tanh", [](const Tensor& t) { return ops::gelu(t); }},
      {"gelu erf", [](const Tensor& t) { return ops::gelu(t, ops::GeluApproximation::none); }},
      {"add scalar", [](const Tensor& t) { return ops::add(t, 0.5); }},
      {"mul scalar", [](const Tensor& t) { return ops::mul(t, 3.0); }},
      {"rdiv scalar", [](const Tensor& t) { return ops::rdiv(2.0, t); }},
  };
  for (const auto& [name, op] : ops_list) expect_unary_footprints(name, op);
}

TEST(MetaElementwise, BinaryOpsMatchCpuBytesForwardAndBackward) {
  using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Binary>> ops_list = {
      {"add", [](const Tensor& a, const Tensor& b) { return ops::add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return ops::sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return ops::mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return ops::div(a, b); }},
  };
  for (const auto& [name, op] : ops_list) {
    for (const DType dtype : kDtypes) {
      for (const bool view : {false, true}) {
        const std::string what = name + " " + std::string(dtype_name(dtype)) + (view ? " view" : "");
        expect_same_footprint(what, [&](Device dev) {
          CategoryGuard acts(MemoryCategory::activations);
          Tensor a = rand({3000, 5}, dtype, dev).set_requires_grad(true);
          Tensor b = rand({view ? 5 : 3000, view ? 3000 : 5}, dtype, dev).set_requires_grad(true);
          const Tensor y = op(a, view ? b.t() : b);
          CategoryGuard grads(MemoryCategory::gradients);
          y.backward(ones(y.shape(), y.dtype(), dev));
          EXPECT_EQ(a.grad().dtype(), dtype) << what;
          EXPECT_EQ(b.grad().shape(), b.shape()) << what;
        });
      }
    }
  }
}

TEST(MetaElementwise, InPlaceOpsMatchCpuBytes) {
  for (const DType dtype : kDtypes) {
    for (const bool view : {false, true}) {
      const std::string what = std::string("add_ mul_ ") + std::string(dtype_name(dtype)) + (view ? " view" : "");
      expect_same_footprint(what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor base = rand({40, 30}, dtype, dev);
        Tensor self = view ? base.t() : base;
        const Tensor other = rand(self.shape(), dtype, dev);
        ops::add_(self, other);
        ops::mul_(self, 0.5);
        ops::add_(self, self);  // aliasing: read from a copy
      });
    }
  }
}

TEST(MetaElementwise, BroadcastBinaryBackwardSumsToEachShape) {
  for (const DType dtype : kDtypes) {
    expect_same_footprint(std::string("bias add and scale ") + std::string(dtype_name(dtype)), [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      Tensor x = rand({64, 3, 40}, dtype, dev).set_requires_grad(true);
      Tensor bias = rand({40}, dtype, dev).set_requires_grad(true);
      Tensor scale = rand({3, 1}, dtype, dev).set_requires_grad(true);
      const Tensor y = ops::div(ops::mul(ops::sub(ops::add(x, bias), bias), scale), scale);
      CategoryGuard grads(MemoryCategory::gradients);
      y.backward(ones(y.shape(), y.dtype(), dev));
      EXPECT_EQ(bias.grad().shape(), bias.shape());
      EXPECT_EQ(scale.grad().shape(), scale.shape());
    });
  }
}

TEST(MetaReduce, SumMeanMaxMatchCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const bool view : {false, true}) {
      const std::string what = std::string(dtype_name(dtype)) + (view ? " view" : "");
      const auto input = [&](Device dev) { return rand({30, 7, 50}, dtype, dev).set_requires_grad(true); };
      expect_same_footprint("sum " + what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor x = input(dev);
        const Tensor in = view ? x.transpose(0, 2) : x;
        const Tensor y = ops::add(ops::sum(in, {0}), ops::sum(ops::sum(in, {1, 2}, true)));
        const Tensor all = ops::sum(ops::mul(y, y));
        EXPECT_EQ(all.dim(), 0);
        CategoryGuard grads(MemoryCategory::gradients);
        all.backward(ones({}, all.dtype(), dev));
        EXPECT_EQ(x.grad().dtype(), dtype);
      });
      expect_same_footprint("mean " + what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor x = input(dev);
        const Tensor in = view ? x.transpose(0, 2) : x;
        const Tensor y = ops::mean(ops::mean(in, {-1}, false));
        CategoryGuard grads(MemoryCategory::gradients);
        y.backward(ones({}, y.dtype(), dev));
        EXPECT_EQ(x.grad().shape(), x.shape());
      });
      expect_same_footprint("max argmax " + what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor x = input(dev);
        const Tensor in = view ? x.transpose(0, 2) : x;
        const Tensor m = ops::max(in, 1, false);
        const Tensor idx = ops::argmax(in, -1, true);
        EXPECT_EQ(idx.dtype(), DType::i64);
        CategoryGuard grads(MemoryCategory::gradients);
        m.backward(ones(m.shape(), m.dtype(), dev));
        EXPECT_EQ(x.grad().shape(), x.shape());
      });
    }
  }
}

TEST(MetaSelect, WhereMaskedFillAndComparisonsMatchCpuBytes) {
  for (const DType dtype : kDtypes) {
    for (const bool view : {false, true}) {
      const std::string what = std::string(dtype_name(dtype)) + (view ? " view" : "");
      expect_same_footprint("where masked_fill " + what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor a = rand({60, 33}, dtype, dev).set_requires_grad(true);
        Tensor b = rand({33}, dtype, dev).set_requires_grad(true);
        const Tensor in = view ? a.t() : a;
        const Tensor cond = ops::gt(in, 0.5);
        EXPECT_EQ(cond.dtype(), DType::boolean);
        const Tensor w = ops::where(ops::lt(a, 0.25), a, b);
        const Tensor f = ops::masked_fill(in, cond, -1.0);
        const Tensor e = ops::eq(in, in);
        const Tensor loss = ops::add(ops::sum(w), ops::sum(f));
        CategoryGuard grads(MemoryCategory::gradients);
        loss.backward(ones({}, loss.dtype(), dev));
        EXPECT_EQ(b.grad().shape(), b.shape());
      });
    }
  }
  for (const DType dtype : {DType::i64, DType::i32, DType::boolean}) {
    expect_same_footprint(std::string("eq ") + std::string(dtype_name(dtype)), [&](Device dev) {
      const Tensor a = zeros({40, 9}, dtype, dev), b = ones({9}, dtype, dev);
      const Tensor e = ops::eq(a, b);
      EXPECT_EQ(e.shape(), (Shape{40, 9}));
      if (dtype != DType::boolean) EXPECT_EQ(ops::gt(a.t(), 0.5).dtype(), DType::boolean);
    });
  }
}

}  // namespace
}  // namespace memtrain
