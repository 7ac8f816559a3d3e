// The Fashion-MNIST CNN (conv, batch norm, relu, max-pool, linear) on the meta device: a training step through
// train::Trainer (two optimizer steps and an evaluation, as tests/test_meta_training.cpp does for the language
// models) must account, per category, exactly the bytes the same steps account on the CPU; so must batch norm
// alone, in training (batch statistics, running statistics updated) and in eval mode, forward and backward.
// Random small images stand in for the data set files.
#include <gtest/gtest.h>

#include "meta_footprint.h"
#include "tiny_lm.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/data/loader.h"
#include "memtrain/nn/batch_norm.h"
#include "memtrain/nn/cnn.h"
#include "memtrain/nn/efficientnet.h"
#include "memtrain/nn/resize.h"
#include "memtrain/ops/nn.h"
#include "memtrain/train/train.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace memtrain {
namespace {

using test_support::expect_same_footprint;
using train::TrainerConfig;

constexpr std::int64_t kImage = 12;  // divisible by 4: two 2x2 pools

std::shared_ptr<nn::CNN> make_cnn() {
  manual_seed(3);
  nn::CNNConfig c;
  c.image_size = kImage;
  c.conv1_channels = 4;
  c.conv2_channels = 8;
  c.hidden = 16;
  c.dropout = 0.1;
  return std::make_shared<nn::CNN>(c);
}

// n random grey images [n, 12, 12] u8 and labels [n] u8 < 10, from a fixed seed.
std::shared_ptr<data::ImageDataset> random_images(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255), label(0, 9);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(n * kImage * kImage)), labels(static_cast<std::size_t>(n));
  for (auto& p : pixels) p = static_cast<std::uint8_t>(byte(gen));
  for (auto& l : labels) l = static_cast<std::uint8_t>(label(gen));
  Tensor images = Tensor::empty({n, kImage, kImage}, DType::u8);
  Tensor targets = Tensor::empty({n}, DType::u8);
  std::copy(pixels.begin(), pixels.end(), images.data<std::uint8_t>());
  std::copy(labels.begin(), labels.end(), targets.data<std::uint8_t>());
  return std::make_shared<data::ImageDataset>(images, targets, 10, "random images", 0.2860, 0.3530);
}

struct Footprint {
  std::array<std::size_t, kNumMemoryCategories> peak{}, live{};
};

// A model and its loss.
struct Run {
  std::shared_ptr<nn::Module> model;
  train::LossFn loss;
};

Run cnn_run() {
  auto model = make_cnn();
  return {model, [model](const data::Batch& b) { return ops::cross_entropy(model->forward(b.inputs), b.targets); }};
}

// The EfficientNet of the example, small, training on images resized from 12x12 to 8x8 as progressive resizing
// does (the resize weights are made on the device, so a plan sees them).
Run efficientnet_run() {
  manual_seed(4);
  nn::EfficientNetConfig c;
  c.image_size = kImage;
  c.width_mult = 0.25;
  c.min_feature_size = 3;  // 12 -> 6 -> 3: the strided blocks too
  c.depth_mult = 0.34;
  c.head_channels = 16;
  c.dropout = 0.1;
  auto model = std::make_shared<nn::EfficientNet>(c);
  return {model, [model](const data::Batch& b) {
            const std::int64_t side = model->is_training() ? 8 : kImage;
            return model->loss(nn::resize_images(b.inputs, side, side), b.targets);
          }};
}

// Two optimizer steps and an evaluation on `device`; the bytes each category reached above what was live once
// the Trainer stood (the model already on the device).
Footprint run(const TrainerConfig& base, Device device, const std::function<Run()>& make = cnn_run) {
  TrainerConfig c = base;
  c.device = device;
  const Run r = make();
  train::Trainer trainer(c, r.model, r.loss, random_images(32, 1), random_images(16, 2));
  Allocator& alloc = Allocator::get(device);
  const MemoryStats before = alloc.stats();
  alloc.reset_peak();
  trainer.train_step();
  trainer.train_step();
  trainer.evaluate();
  const MemoryStats after = alloc.stats();
  Footprint f;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    f.peak[i] = after.by_category[i].peak_bytes - before.by_category[i].live_bytes;
    f.live[i] = after.by_category[i].live_bytes - before.by_category[i].live_bytes;
  }
  return f;
}

struct Variant {
  std::string name;
  std::function<void(TrainerConfig&)> configure;
};

void expect_meta_accounts_cpu_bytes(const std::function<Run()>& make) {
  const std::vector<Variant> variants = {
      {"adamw", [](TrainerConfig&) {}},
      {"sgd+accum", [](TrainerConfig& c) {
         c.optimizer = optim::Spec::sgd({.lr = 1e-2});
         c.grad_accum = 2;
       }},
      {"full checkpointing", [](TrainerConfig& c) { c.activation_checkpointing = ckpt::Policy::full(); }},
      {"selective checkpointing", [](TrainerConfig& c) { c.activation_checkpointing = ckpt::Policy::selective(); }},
  };
  constexpr std::array<MemoryCategory, 6> compared = {
      MemoryCategory::parameters, MemoryCategory::compute_weights, MemoryCategory::gradients,
      MemoryCategory::optimizer_state, MemoryCategory::activations, MemoryCategory::workspace};
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    TrainerConfig c = test_support::short_run_config();
    v.configure(c);
    const Footprint cpu = run(c, Device::cpu(), make);
    Footprint meta;
    try {
      meta = run(c, Device::meta(), make);
    } catch (const Error& e) {
      ADD_FAILURE() << v.name << ": the step does not run on meta: " << e.what();
      continue;
    }
    EXPECT_GT(cpu.peak[static_cast<int>(MemoryCategory::activations)], 0u) << v.name << ": nothing was measured";
    EXPECT_GT(cpu.peak[static_cast<int>(MemoryCategory::gradients)], 0u) << v.name << ": nothing was measured";
    for (const MemoryCategory cat : compared) {
      const int i = static_cast<int>(cat);
      EXPECT_EQ(meta.peak[i], cpu.peak[i]) << v.name << ": peak " << category_name(cat);
      EXPECT_EQ(meta.live[i], cpu.live[i]) << v.name << ": live " << category_name(cat);
    }
  }
}

TEST(MetaCnn, TrainingStepAccountsTheCpuBytes) { expect_meta_accounts_cpu_bytes(cnn_run); }

TEST(MetaCnn, EfficientNetTrainingStepAccountsTheCpuBytes) { expect_meta_accounts_cpu_bytes(efficientnet_run); }

// The module in training mode (forward, backward, running statistics moved) and then in eval mode.
TEST(MetaCnn, BatchNormMatchesCpuBytesInTrainingAndEval) {
  for (const DType dtype : {DType::f32, DType::f64}) {
    expect_same_footprint(std::string("BatchNorm2d ") + std::string(dtype_name(dtype)), [&](Device dev) {
      nn::BatchNorm2d bn(6, 1e-5, 0.1, dtype);
      bn.to(dev);
      CategoryGuard acts(MemoryCategory::activations);
      Tensor x = randn({3, 6, 5, 4}, dtype, dev).set_requires_grad(true);
      const Tensor y = bn.forward(x);
      EXPECT_EQ(y.shape(), x.shape());
      {
        CategoryGuard grads(MemoryCategory::gradients);
        y.backward(ones(y.shape(), y.dtype(), dev));
      }
      EXPECT_TRUE(x.grad().defined());
      bn.eval();
      const Tensor z = bn.forward(randn({2, 6, 5, 4}, dtype, dev));
      EXPECT_EQ(z.shape(), (Shape{2, 6, 5, 4}));
    });
  }
}

// ops::batch_norm without an affine transform and without running statistics (training only).
TEST(MetaCnn, BatchNormOpWithoutAffineMatchesCpuBytes) {
  expect_same_footprint("ops::batch_norm, no weight or bias", [](Device dev) {
    CategoryGuard acts(MemoryCategory::activations);
    Tensor x = randn({4, 3, 6, 6}, DType::f32, dev).set_requires_grad(true);
    const Tensor y = ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, true);
    CategoryGuard grads(MemoryCategory::gradients);
    y.backward(ones(y.shape(), y.dtype(), dev));
    EXPECT_TRUE(x.grad().defined());
  });
}

}  // namespace
}  // namespace memtrain
