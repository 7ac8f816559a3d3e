// The meta device for the matmul / attention / softmax / loss / embedding / dropout family: each op run on
// meta must allocate, per memory category, exactly what it allocates on the CPU (src/meta/), forward and
// backward, for every dtype the CPU takes and for non-contiguous operands.
#include <gtest/gtest.h>

#include "meta_footprint.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"

#include <array>
#include <functional>
#include <string>

namespace memtrain {
namespace {

using test_support::expect_same_footprint;
using test_support::Footprint;

constexpr std::array<DType, 4> kDtypes{DType::f32, DType::bf16, DType::f16, DType::f64};

// Forward and backward of fn's result, the gradient in the gradients category.
void backward_ones(const Tensor& y, Device dev) {
  CategoryGuard grads(MemoryCategory::gradients);
  y.backward(ones(y.shape(), y.dtype(), dev));
}

TEST(MetaMatmul, MatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    const std::string name(dtype_name(dtype));
    expect_same_footprint("matmul 2-D " + name, [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      Tensor a = randn({33, 20}, dtype, dev).set_requires_grad(true);
      Tensor b = randn({20, 17}, dtype, dev).set_requires_grad(true);
      const Tensor y = ops::matmul(a, b);
      EXPECT_EQ(y.shape(), (Shape{33, 17}));
      backward_ones(y, dev);
      EXPECT_TRUE(a.grad().defined() && b.grad().defined());
    });
    expect_same_footprint("matmul batched x shared transposed weight " + name, [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      Tensor a = randn({3, 9, 20}, dtype, dev).set_requires_grad(true);
      Tensor w = randn({17, 20}, dtype, dev).set_requires_grad(true);
      const Tensor y = ops::matmul(a, w.t());
      backward_ones(y, dev);
      EXPECT_TRUE(w.grad().defined());
    });
    expect_same_footprint("matmul batched x batched, transposed views " + name, [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      Tensor a = randn({2, 3, 20, 9}, dtype, dev).set_requires_grad(true);
      Tensor b = randn({2, 3, 11, 20}, dtype, dev).set_requires_grad(true);
      const Tensor y = ops::matmul(a.transpose(-1, -2), b.transpose(-1, -2));  // [2, 3, 9, 11]
      backward_ones(y, dev);
      EXPECT_TRUE(a.grad().defined() && b.grad().defined());
    });
    expect_same_footprint("matmul non-contiguous batch " + name, [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      Tensor a = randn({4, 3, 8, 5}, dtype, dev);
      Tensor b = randn({3, 5, 6}, dtype, dev);
      const Tensor y = ops::matmul(a.transpose(0, 1), b.reshape({3, 1, 5, 6}).expand({3, 4, 5, 6}));
      EXPECT_EQ(y.shape(), (Shape{3, 4, 8, 6}));
    });
  }
  // More than one narrow slab (2^21 f32 elements): the slab buffer and the per-slab f16 widening.
  for (const DType dtype : {DType::bf16, DType::f16}) {
    expect_same_footprint(std::string("matmul slabs ") + std::string(dtype_name(dtype)), [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      const Tensor a = randn({1100, 4}, dtype, dev), b = randn({4, 2048}, dtype, dev);
      EXPECT_EQ(ops::matmul(a, b).shape(), (Shape{1100, 2048}));
    });
  }
}

TEST(MetaMatmul, LinearMatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const bool with_bias : {true, false}) {
      const std::string what = std::string("linear ") + std::string(dtype_name(dtype)) + (with_bias ? " bias" : " no bias");
      expect_same_footprint(what, [&](Device dev) {
        Tensor w, b;
        {
          CategoryGuard params(MemoryCategory::parameters);
          w = randn({24, 16}, dtype, dev).set_requires_grad(true);
          // db is sum(dY) (src/ops/reduce.cpp, another family's op): the bias takes no gradient here.
          if (with_bias) b = randn({24}, dtype, dev);
        }
        CategoryGuard acts(MemoryCategory::activations);
        Tensor x = randn({2, 7, 16}, dtype, dev).set_requires_grad(true);
        const Tensor y = ops::linear(x, w, b);
        EXPECT_EQ(y.shape(), (Shape{2, 7, 24}));
        backward_ones(y, dev);
        EXPECT_TRUE(x.grad().defined() && w.grad().defined());
      });
    }
  }
  // A non-contiguous input (reshape copies it), and narrow slabs with a bias.
  expect_same_footprint("linear non-contiguous input", [&](Device dev) {
    const Tensor w = randn({24, 16}, DType::f32, dev), b = randn({24}, DType::f32, dev);
    const Tensor x = randn({16, 10}, DType::f32, dev);
    EXPECT_EQ(ops::linear(x.t(), w, b).shape(), (Shape{10, 24}));
  });
  expect_same_footprint("linear bf16 slabs with bias", [&](Device dev) {
    const Tensor w = randn({2048, 4}, DType::bf16, dev), b = randn({2048}, DType::bf16, dev);
    const Tensor x = randn({1100, 4}, DType::bf16, dev);
    EXPECT_EQ(ops::linear(x, w, b).shape(), (Shape{1100, 2048}));
  });
}

TEST(MetaEmbedding, MatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const DType index_dtype : {DType::i64, DType::i32}) {
      const std::string what = "embedding " + std::string(dtype_name(dtype)) + " " + std::string(dtype_name(index_dtype));
      expect_same_footprint(what, [&](Device dev) {
        Tensor w;
        {
          CategoryGuard params(MemoryCategory::parameters);
          w = randn({50, 12}, dtype, dev).set_requires_grad(true);
        }
        CategoryGuard acts(MemoryCategory::activations);
        // Non-contiguous indices (a transposed view): both directions make their contiguous copy.
        const Tensor ids = full({7, 3}, 4.0, index_dtype, dev).t();
        const Tensor y = ops::embedding(w, ids);
        EXPECT_EQ(y.shape(), (Shape{3, 7, 12}));
        backward_ones(y, dev);
        EXPECT_EQ(w.grad().dtype(), dtype);
      });
    }
  }
}

TEST(MetaEmbedding, OutOfRangeIndicesAreCheckedOnlyWhereDataExists) {
  const Tensor w = zeros({5, 4}, DType::f32, Device::meta());
  // Meta has no index values to check (they read as zeros); the CPU refuses the same call.
  EXPECT_EQ(ops::embedding(w, full({3}, 9.0, DType::i64, Device::meta())).shape(), (Shape{3, 4}));
  EXPECT_THROW(ops::embedding(zeros({5, 4}), full({3}, 9.0, DType::i64)), Error);
}

TEST(MetaSoftmax, MatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const bool log : {false, true}) {
      for (const std::int64_t dim : {-1, 1}) {
        const std::string what = std::string(log ? "log_softmax " : "softmax ") + std::string(dtype_name(dtype)) +
                                 " dim " + std::to_string(dim);
        expect_same_footprint(what, [&](Device dev) {
          CategoryGuard acts(MemoryCategory::activations);
          Tensor x = randn({4, 6, 10}, dtype, dev).set_requires_grad(true);
          // A transposed (non-contiguous) view: the kernel reads a contiguous copy.
          const Tensor xt = x.transpose(0, 2);  // [10, 6, 4]
          const Tensor y = log ? ops::log_softmax(xt, dim) : ops::softmax(xt, dim);
          backward_ones(y, dev);
          EXPECT_EQ(x.grad().dtype(), dtype);
        });
      }
    }
  }
}

TEST(MetaCrossEntropy, MatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const ops::Reduction reduction : {ops::Reduction::mean, ops::Reduction::sum, ops::Reduction::none}) {
      const std::string what = "cross_entropy " + std::string(dtype_name(dtype)) + " reduction " +
                               std::to_string(static_cast<int>(reduction));
      expect_same_footprint(what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor logits = randn({9, 13}, dtype, dev).set_requires_grad(true);
        const Tensor targets = full({2, 9}, 3.0, DType::i64, dev).select(0, 1);
        const Tensor loss = ops::cross_entropy(logits, targets, reduction);
        backward_ones(loss, dev);
        EXPECT_EQ(logits.grad().dtype(), dtype);
      });
    }
  }
}

TEST(MetaCrossEntropy, TargetsAreCheckedOnlyWhereDataExists) {
  const Tensor logits = zeros({3, 4}, DType::f32, Device::meta());
  // Meta targets read as zeros: no range error, every row counted, a loss that reads 0.
  const Tensor loss = ops::cross_entropy(logits, full({3}, 7.0, DType::i64, Device::meta()));
  EXPECT_EQ(loss.item(), 0.0);
  EXPECT_THROW(ops::cross_entropy(zeros({3, 4}), full({3}, 7.0, DType::i64)), Error);
}

TEST(MetaAttention, MatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const bool causal : {true, false}) {
      const std::string what = "attention " + std::string(dtype_name(dtype)) + (causal ? " causal" : " full");
      expect_same_footprint(what + " separate q, k, v", [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor q = randn({2, 3, 70, 8}, dtype, dev).set_requires_grad(true);
        Tensor k = randn({2, 3, 70, 8}, dtype, dev).set_requires_grad(true);
        Tensor v = randn({2, 3, 70, 8}, dtype, dev).set_requires_grad(true);
        const Tensor y = ops::scaled_dot_product_attention(q, k, v, causal);
        backward_ones(y, dev);
        EXPECT_TRUE(q.grad().defined() && k.grad().defined() && v.grad().defined());
      });
      // Head views of one [B, T, 3 * H * D] projection (strided, no copy) and a non-unit-stride D (copied).
      expect_same_footprint(what + " head views", [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        const Tensor qkv = randn({2, 70, 3 * 3 * 8}, dtype, dev);
        const Tensor q = qkv.narrow(2, 0, 24).reshape({2, 70, 3, 8}).transpose(1, 2);
        const Tensor k = qkv.narrow(2, 24, 24).reshape({2, 70, 3, 8}).transpose(1, 2);
        const Tensor v = randn({2, 3, 8, 70}, dtype, dev).transpose(2, 3);
        EXPECT_EQ(ops::scaled_dot_product_attention(q, k, v, causal).shape(), (Shape{2, 3, 70, 8}));
      });
    }
  }
}

TEST(MetaDropout, MatchesCpuBytesAndRngForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    expect_same_footprint("dropout " + std::string(dtype_name(dtype)), [&](Device dev) {
      CategoryGuard acts(MemoryCategory::activations);
      Tensor x = randn({5, 33}, dtype, dev).set_requires_grad(true);
      // A transposed view: the CPU kernel reads a contiguous copy.
      const Tensor y = ops::dropout(x.t(), 0.25);
      backward_ones(y, dev);
      EXPECT_EQ(x.grad().dtype(), dtype);
    });
  }
}

TEST(MetaPool, MatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const bool is_max : {true, false}) {
      const std::string what = std::string(is_max ? "max_pool2d " : "avg_pool2d ") + std::string(dtype_name(dtype));
      expect_same_footprint(what, [&](Device dev) {
        CategoryGuard acts(MemoryCategory::activations);
        Tensor x = randn({2, 3, 9, 8}, dtype, dev).set_requires_grad(true);
        // A transposed (non-contiguous) input: the kernel reads a contiguous copy.
        const Tensor xt = x.transpose(2, 3);  // [2, 3, 8, 9]
        const Tensor y = is_max ? ops::max_pool2d(xt, 3, 2, 1) : ops::avg_pool2d(xt, 2);
        backward_ones(y, dev);
        EXPECT_EQ(x.grad().dtype(), dtype);
      });
    }
  }
}

TEST(MetaConv, MatchesCpuBytesForwardAndBackward) {
  for (const DType dtype : kDtypes) {
    for (const bool with_bias : {true, false}) {
      const std::string what = "conv2d " + std::string(dtype_name(dtype)) + (with_bias ? " bias" : " no bias");
      expect_same_footprint(what, [&](Device dev) {
        Tensor w, b;
        {
          CategoryGuard params(MemoryCategory::parameters);
          w = randn({6, 2, 3, 3}, dtype, dev).set_requires_grad(true);
          if (with_bias) b = randn({6}, dtype, dev).set_requires_grad(true);
        }
        CategoryGuard acts(MemoryCategory::activations);
        Tensor x = randn({2, 4, 9, 7}, dtype, dev).set_requires_grad(true);
        // A transposed (non-contiguous) input, two groups, stride and padding.
        const Tensor y = ops::conv2d(x.transpose(2, 3), w, b, 2, 1, 2);
        backward_ones(y, dev);
        EXPECT_TRUE(x.grad().defined() && w.grad().defined());
        if (with_bias) EXPECT_EQ(b.grad().dtype(), dtype);
      });
    }
  }
}

}  // namespace
}  // namespace memtrain
