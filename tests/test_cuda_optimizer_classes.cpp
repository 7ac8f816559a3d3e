// The optimizer classes with parameters on a CUDA device: optim::SGD, AdamW, Lion, AdamW8bit and Lion8bit
// route their update to the fused kernels of cuda/optim.h. The same class on CPU copies of the same parameters and
// gradients is the reference: several steps, two parameter groups, state_dict of both sides compared.
// Skipped without a device, except the check that the still CPU-only optimizers refuse device parameters.
#include "memtrain/core/error.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/optim/adamw8bit.h"
#include "memtrain/optim/lion8bit.h"
#include "memtrain/optim/optim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using optim::ParamGroup;
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<ParamGroup>)>;

// ||a - b|| / ||b|| over two tensors of the same shape (b on the CPU is the reference); infinite when a
// holds NaN or Inf. Normwise, because the 8-bit optimizers' small-tensor path and the CUDA AdamW kernel
// round differently (FMA), which is an ulp of the terms but a large relative error where a value is ~0.
double rel_diff(const Tensor& device_side, const Tensor& cpu_side) {
  const Tensor a = device_side.to(Device::cpu()).contiguous();
  const Tensor b = cpu_side.contiguous();
  EXPECT_EQ(a.shape(), b.shape());
  double diff2 = 0.0, ref2 = 0.0;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    if (!std::isfinite(x)) return INFINITY;
    diff2 += (x - y) * (x - y);
    ref2 += y * y;
  }
  return ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
}

// Runs `steps` steps of the optimizer on CPU parameters and on cuda:0 copies with equal gradients and
// checks parameters and every state tensor after each step.
void expect_device_matches_cpu(const MakeOptimizer& make, int steps) {
  // 5200 elements: 8-bit state for the 8-bit optimizers (>= 4096), with a partial last block of 256;
  // the others keep f32 state there.
  const std::vector<Shape> shapes{{80, 65}, {1000}, {3}};
  std::vector<Tensor> cpu_params, dev_params;
  for (const Shape& s : shapes) {
    cpu_params.push_back(randn(s));
    dev_params.push_back(cpu_params.back().to(Device::cuda(0)));
  }
  auto groups = [](const std::vector<Tensor>& p) {
    return std::vector<ParamGroup>{ParamGroup{{p[0], p[1]}, 1e-2, 0.1, 0.9, 0.99, 1e-8},
                                   ParamGroup{{p[2]}, 3e-3, 0.0, 0.8, 0.95, 1e-6}};
  };
  auto cpu_opt = make(groups(cpu_params));
  auto dev_opt = make(groups(dev_params));
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Tensor g = randn(shapes[i]);
      cpu_params[i].set_grad(g);
      dev_params[i].set_grad(g.to(Device::cuda(0)));
    }
    EXPECT_EQ(cpu_opt->step().updated, 3);
    EXPECT_EQ(dev_opt->step().updated, 3);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_LT(rel_diff(dev_params[i], cpu_params[i]), 1e-5) << cpu_opt->name() << " param " << i << " step " << step;
    }
  }
  const optim::StateDict cpu_state = cpu_opt->state_dict(), dev_state = dev_opt->state_dict();
  ASSERT_EQ(cpu_state.size(), dev_state.size());
  for (const auto& [key, t] : cpu_state) {
    ASSERT_TRUE(dev_state.count(key)) << key;
    EXPECT_TRUE(dev_state.at(key).device().is_cpu()) << "state_dict holds CPU copies: " << key;
    const Tensor& d = dev_state.at(key);
    ASSERT_EQ(d.dtype(), t.dtype()) << key;
    if (t.dtype() == DType::f32) {
      EXPECT_LT(rel_diff(d, t), 1e-5) << key;
    } else if (t.dtype() == DType::u8) {
      // 8-bit codes: the CPU and the kernel round the same operations in the same order, so a code may
      // differ only where an f32 result lands within rounding of a decision midpoint: rare, and by one.
      std::int64_t off_by_one = 0, worse = 0;
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        const int a = d.data<std::uint8_t>()[i], b = t.data<std::uint8_t>()[i];
        off_by_one += std::abs(a - b) == 1;
        worse += std::abs(a - b) > 1;
      }
      EXPECT_EQ(worse, 0) << key;
      EXPECT_LE(off_by_one, t.numel() / 1000) << key;
    } else {
      EXPECT_EQ(d.item(), t.item()) << key;
    }
  }
}

TEST(CudaOptimizerClasses, SgdWithMomentumAndNesterovMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_device_matches_cpu([](auto g) { return std::make_unique<optim::SGD>(std::move(g)); }, 4);
  expect_device_matches_cpu([](auto g) { return std::make_unique<optim::SGD>(std::move(g), true); }, 4);
}

TEST(CudaOptimizerClasses, AdamWMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_device_matches_cpu([](auto g) { return std::make_unique<optim::AdamW>(std::move(g)); }, 5);
}

TEST(CudaOptimizerClasses, LionMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_device_matches_cpu([](auto g) { return std::make_unique<optim::Lion>(std::move(g)); }, 5);
}

TEST(CudaOptimizerClasses, AdamW8bitMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_device_matches_cpu([](auto g) { return std::make_unique<optim::AdamW8bit>(std::move(g)); }, 5);
  expect_device_matches_cpu([](auto g) { return std::make_unique<optim::AdamW8bit>(std::move(g), 64); }, 3);
}

TEST(CudaOptimizerClasses, Lion8bitMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  expect_device_matches_cpu([](auto g) { return std::make_unique<optim::Lion8bit>(std::move(g)); }, 5);
}

TEST(CudaOptimizerClasses, UnsupportedBlockSizeOnDeviceIsRefused) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Tensor p = randn({5000}).to(Device::cuda(0));
  p.set_grad(randn({5000}).to(Device::cuda(0)));
  optim::AdamW8bit opt({ParamGroup{{p}, 1e-2}}, /*block_size=*/100);
  try {
    opt.step();
    FAIL() << "block size 100 accepted on cuda:0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_size 100"), std::string::npos) << e.what();
  }
}

TEST(CudaOptimizerClasses, NonFiniteDeviceGradientIsSkippedAndReported) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Tensor p = randn({4097}).to(Device::cuda(0));
  const Tensor before = p.to(Device::cpu());
  optim::AdamW opt({ParamGroup{{p}, 1e-2}});
  Tensor g = randn({4097});
  g.data<float>()[4096] = NAN;
  p.set_grad(g.to(Device::cuda(0)));
  const optim::StepReport report = opt.step();
  EXPECT_EQ(report.skipped_nonfinite, 1);
  EXPECT_EQ(report.updated, 0);
  EXPECT_EQ(rel_diff(p, before), 0.0);
}

}  // namespace
}  // namespace memtrain
