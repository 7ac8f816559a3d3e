// Training on a CUDA device: nn::Module::to (in place, tied weights once, leaves kept, memory accounted on the
// device, a CPU -> CUDA -> CPU round trip bit-identical), and train::Trainer with config.device = "cuda" against
// the same run on the CPU: a small GPT trained a few steps with each technique the CPU trainer tests use
// (AdamW, 8-bit AdamW, GaLore, activation checkpointing, gradient accumulation with clipping, layer-wise
// updates, dropout, bf16 and fp16 autocast (fp16 with loss scaling), FP8 linears with delayed and blockwise
// scaling), the losses compared step by step; a checkpoint written on the device resumes there. Those skip
// without a device. The device-unavailable errors, Module::to(cpu) as a no-op and Tensor::set_data_ run
// everywhere.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/amp/autocast.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/llama.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/optim/spec.h"
#include "memtrain/train/train.h"

#include "error_text.h"
#include "temp_dir.h"
#include "token_dataset.h"
#include "trainer_fixtures.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::Device;
using mt::Tensor;
using mt::train::Trainer;
using mt::train::TrainerConfig;

namespace {

using mt::test_support::TokenDataset;

#define SKIP_WITHOUT_CUDA()                                                                 \
  do {                                                                                      \
    if (!mt::cuda::is_available())                                                          \
      GTEST_SKIP() << "no usable CUDA device: " << mt::cuda::unavailable_reason();          \
  } while (0)

mt::nn::GPTConfig small_gpt(double dropout) {
  mt::nn::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = dropout;
  return c;
}

std::shared_ptr<mt::nn::GPT> make_gpt(double dropout = 0.0) {
  mt::manual_seed(7);
  return std::make_shared<mt::nn::GPT>(small_gpt(dropout));
}

using mt::test_support::gpt_loss;

TrainerConfig base_config() {
  TrainerConfig c = mt::test_support::quiet_config();
  c.data.shuffle = true;
  c.micro_batch = 4;
  c.max_steps = 5;
  c.seed = 3;
  c.optimizer = mt::optim::Spec::adamw({.lr = 3e-3, .weight_decay = 0.1});
  return c;
}

// Every parameter's values, flattened, in named_parameters order (read back from any device).
std::vector<std::vector<float>> values(const mt::nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor c = p.detach().to(Device::cpu()).contiguous();
    out.emplace_back(c.data<float>(), c.data<float>() + c.numel());
  }
  return out;
}

// ||a - b|| / ||b|| over all parameters.
double rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double d2 = 0, r2 = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    for (std::size_t j = 0; j < b[i].size(); ++j) {
      const double x = a[i][j], y = b[i][j];
      if (!std::isfinite(x)) return INFINITY;
      d2 += (x - y) * (x - y);
      r2 += y * y;
    }
  return std::sqrt(d2 / r2);
}

using mt::test_support::error_of;

// ---- everywhere ------------------------------------------------------------------------------------------

TEST(CudaTrainerDevice, SetDataRepointsEveryHandle) {
  Tensor a = mt::tensor<float>({1, 2, 3, 4}, {2, 2});
  Tensor handle = a;  // a second handle on the same TensorImpl, as a layer keeps
  a.set_requires_grad(true);
  const Tensor b = mt::tensor<float>({5, 6, 7, 8}, {2, 2});
  a.set_data_(b);
  EXPECT_TRUE(handle.shares_storage_with(b));
  EXPECT_EQ(handle.data<float>()[3], 8.0f);
  EXPECT_TRUE(handle.requires_grad());
  EXPECT_TRUE(handle.is_leaf());
  EXPECT_NE(error_of([&] { a.set_data_(mt::tensor<float>({1, 2}, {2})); }).find("set_data_"), std::string::npos);
  EXPECT_NE(error_of([&] { a.set_data_(mt::zeros({2, 2}, mt::DType::f64)); }).find("dtype"), std::string::npos);
}

TEST(CudaTrainerDevice, ToCpuIsANoOpThatKeepsStorage) {
  auto gpt = make_gpt();
  std::vector<const void*> before;
  for (const auto& [name, p] : gpt->named_parameters()) before.push_back(p.storage().get());
  const auto values_before = values(*gpt);
  EXPECT_EQ(&gpt->to(Device::cpu()), gpt.get());
  std::size_t i = 0;
  for (const auto& [name, p] : gpt->named_parameters()) {
    EXPECT_EQ(p.storage().get(), before[i++]) << name;
    EXPECT_TRUE(p.is_leaf() && p.requires_grad()) << name;
  }
  EXPECT_EQ(values(*gpt), values_before);
  EXPECT_TRUE(gpt->device().is_cpu());
}

// What a machine without a usable device says: Module::to and a Trainer asked for CUDA throw memtrain::Error
// naming CUDA, and the model stays on the CPU. With a device, an index past the last one is refused instead.
TEST(CudaTrainerDevice, UnusableDeviceThrowsNamingCuda) {
  auto gpt = make_gpt();
  const int missing = mt::cuda::is_available() ? mt::cuda::device_count() : 0;
  const std::string to_error = error_of([&] { gpt->to(Device::cuda(missing)); });
  EXPECT_NE(to_error.find("Module::to"), std::string::npos) << to_error;
  EXPECT_NE(to_error.find(fmt::format("cuda:{}", missing)), std::string::npos) << to_error;
  EXPECT_TRUE(gpt->device().is_cpu());
  if (!mt::cuda::is_available()) {
    EXPECT_NE(to_error.find("CUDA"), std::string::npos) << to_error;
    TrainerConfig c = base_config();
    c.device = Device::cuda(0);
    auto ds = std::make_shared<TokenDataset>(16, 16, 64);
    const std::string trainer_error = error_of([&] { Trainer t(c, gpt, gpt_loss(gpt), ds); });
    EXPECT_NE(trainer_error.find("config.device 'cuda:0'"), std::string::npos) << trainer_error;
    EXPECT_NE(trainer_error.find("CUDA is not usable"), std::string::npos) << trainer_error;
    EXPECT_TRUE(gpt->device().is_cpu());
  }
}

TEST(CudaTrainerDevice, ConfigDeviceRoundTripsAndIsChecked) {
  TrainerConfig c = base_config();
  c.device = Device::cuda(1);
  EXPECT_EQ(TrainerConfig::from_json(c.to_json()).device, Device::cuda(1));
  EXPECT_EQ(TrainerConfig::from_json(nlohmann::json::object()).device, Device::cpu());
  EXPECT_EQ(mt::train::device_from_name("cuda"), Device::cuda(0));
  EXPECT_EQ(mt::train::device_from_name("cuda:3"), Device::cuda(3));
  EXPECT_EQ(mt::train::device_from_name("cpu"), Device::cpu());
  for (const std::string bad : {"gpu", "cuda:", "cuda:x", "CUDA", "cuda:12345"}) {
    nlohmann::json j = c.to_json();
    j["device"] = bad;
    EXPECT_NE(error_of([&] { (void)TrainerConfig::from_json(j); }).find(fmt::format("device '{}'", bad)),
              std::string::npos)
        << bad;
  }
  c.device = Device::cuda(0);
  for (const std::string precision : {"fp32", "bf16", "fp16", "fp8"}) {
    c.precision = mt::amp::parse_precision(precision);
    EXPECT_NO_THROW(c.validate()) << precision << ": every precision runs on CUDA";
  }
}

// ---- with a device -----------------------------------------------------------------------------------------

TEST(CudaTrainer, ModuleToRoundTripIsBitIdenticalAndKeepsLeaves) {
  SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  auto gpt = make_gpt();
  const auto values_cpu = values(*gpt);
  std::vector<const mt::TensorImpl*> impls;
  std::size_t param_bytes = 0;
  for (const auto& [name, p] : gpt->named_parameters()) {
    impls.push_back(p.impl_ptr().get());
    param_bytes += p.nbytes();
  }
  mt::Allocator& device_alloc = mt::Allocator::get(dev);
  const std::size_t live_before = device_alloc.stats()[mt::MemoryCategory::parameters].live_bytes;

  gpt->to(dev);
  EXPECT_EQ(gpt->device(), dev);
  EXPECT_EQ(device_alloc.stats()[mt::MemoryCategory::parameters].live_bytes - live_before, param_bytes)
      << "every parameter once (the tied head is wte.weight), under MemoryCategory::parameters";
  std::size_t i = 0;
  for (const auto& [name, p] : gpt->named_parameters()) {
    EXPECT_EQ(p.impl_ptr().get(), impls[i++]) << name << ": moved in place, the same tensor";
    EXPECT_EQ(p.device(), dev) << name;
    EXPECT_TRUE(p.is_leaf() && p.requires_grad()) << name;
  }
  EXPECT_EQ(values(*gpt), values_cpu);

  // The layers' own handles see the moved data: a forward runs on the device, and gradients land there.
  auto ds = std::make_shared<TokenDataset>(8, 16, 64);
  const mt::data::Batch batch = ds->collate({0, 1});
  gpt->loss(batch.inputs.to(dev), batch.targets.to(dev)).backward();
  for (const auto& [name, p] : gpt->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().device(), dev) << name;
  }
  gpt->to(Device::cpu());  // gradients move along
  for (const auto& [name, p] : gpt->named_parameters()) EXPECT_TRUE(p.grad().device().is_cpu()) << name;
  EXPECT_EQ(device_alloc.stats()[mt::MemoryCategory::parameters].live_bytes, live_before);
  EXPECT_EQ(values(*gpt), values_cpu) << "CPU -> CUDA -> CPU is bit-identical";

  // An optimizer made after the move steps the device parameters; one AdamW step matches the CPU's.
  auto ref = make_gpt();
  gpt->zero_grad();
  gpt->to(dev);
  const auto spec = mt::optim::Spec::adamw({.lr = 1e-2, .weight_decay = 0.1});
  auto opt_dev = spec.make(mt::optim::decay_groups(gpt->named_parameters(), spec.lr, spec.weight_decay));
  auto opt_cpu = spec.make(mt::optim::decay_groups(ref->named_parameters(), spec.lr, spec.weight_decay));
  gpt->loss(batch.inputs.to(dev), batch.targets.to(dev)).backward();
  ref->loss(batch.inputs, batch.targets).backward();
  opt_dev->step();
  opt_cpu->step();
  // f32 forward and backward in another summation order (cuBLAS, the CUDA kernels): ~1e-6 per element.
  const double d = rel_diff(values(*gpt), values(*ref));
  EXPECT_LT(d, 1e-5);
  EXPECT_GT(rel_diff(values(*gpt), values_cpu), 1e-4) << "the step changed the parameters";
}

// ops::fused_linear_cross_entropy on the device against the CPU op: loss and the gradients of x, weight and
// bias, for each reduction, an ignored target, N not a multiple of the chunk, i32 and i64 targets, bf16 and f16 x.
TEST(CudaTrainer, FusedLinearCrossEntropyMatchesTheCpu) {
  SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  const std::int64_t N = 37, C = 24, V = 51, chunk = 16;
  for (const mt::DType xdtype : {mt::DType::f32, mt::DType::bf16, mt::DType::f16}) {
    for (const mt::DType idtype : {mt::DType::i64, mt::DType::i32}) {
      for (const mt::ops::Reduction red : {mt::ops::Reduction::mean, mt::ops::Reduction::sum,
                                           mt::ops::Reduction::none}) {
        SCOPED_TRACE(fmt::format("x {} targets {} reduction {}", mt::dtype_name(xdtype), mt::dtype_name(idtype),
                                 static_cast<int>(red)));
        mt::manual_seed(11);
        const Tensor x_cpu = mt::randn({N, C}).to(xdtype).set_requires_grad(true);
        const Tensor w_cpu = (mt::randn({V, C}) * 0.3).set_requires_grad(true);
        const Tensor b_cpu = (mt::randn({V}) * 0.1).set_requires_grad(true);
        std::vector<std::int64_t> ids(static_cast<std::size_t>(N));
        for (std::int64_t i = 0; i < N; ++i) ids[static_cast<std::size_t>(i)] = (i * 7 + 3) % V;
        ids[5] = -100;  // ignored
        const Tensor t_cpu = mt::tensor(ids, {N}).to(idtype);
        const Tensor x_dev = x_cpu.detach().to(dev).set_requires_grad(true);
        const Tensor w_dev = w_cpu.detach().to(dev).set_requires_grad(true);
        const Tensor b_dev = b_cpu.detach().to(dev).set_requires_grad(true);
        const Tensor l_cpu = mt::ops::fused_linear_cross_entropy(x_cpu, w_cpu, b_cpu, t_cpu, red, -100, chunk);
        const Tensor l_dev =
            mt::ops::fused_linear_cross_entropy(x_dev, w_dev, b_dev, t_cpu.to(dev), red, -100, chunk);
        ASSERT_EQ(l_dev.device(), dev);
        // A weighted sum, so each row's gradient scale differs for reduction none.
        const Tensor wsum = mt::arange(0.0, static_cast<double>(l_cpu.numel()), 1.0).reshape(l_cpu.shape()) + 1.0;
        mt::ops::sum(l_cpu * wsum).backward();
        mt::ops::sum(l_dev * wsum.to(dev)).backward();
        // f32 GEMMs in another order: ~1e-6 relative; bf16 x is widened the same way on both sides.
        const auto flat = [](const Tensor& t) {
          const Tensor c = t.detach().to(Device::cpu()).to(mt::DType::f32).contiguous();
          return std::vector<std::vector<float>>{std::vector<float>(c.data<float>(), c.data<float>() + c.numel())};
        };
        const double tol = xdtype == mt::DType::f32 ? 1e-5 : 1e-2;  // bf16 / f16 dx is rounded to 8 / 11 bits
        EXPECT_LT(rel_diff(flat(l_dev), flat(l_cpu)), 1e-5);
        EXPECT_LT(rel_diff(flat(x_dev.grad()), flat(x_cpu.grad())), tol);
        EXPECT_LT(rel_diff(flat(w_dev.grad()), flat(w_cpu.grad())), 1e-5);
        EXPECT_LT(rel_diff(flat(b_dev.grad()), flat(b_cpu.grad())), 1e-5);
        if (red == mt::ops::Reduction::none) EXPECT_EQ(l_dev.to(Device::cpu()).data<float>()[5], 0.0f);
      }
    }
  }
}

// The head's gradients made in the forward (ops::LossGradientSeed) on the device: the same bits as its recompute
// there, and within rounding of the CPU's. Under bf16/f16 autocast the device runs the head's GEMMs narrow
// (cuBLASLt, Backend::gemm_narrow_native), the CPU in bf16 or (f16) in f32, hence the narrow tolerance.
TEST(CudaTrainer, FusedHeadGradientsInTheForwardMatchTheRecomputeAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  const Device dev = Device::cuda(0);
  const std::int64_t N = 41, C = 32, V = 57, chunk = 16;
  for (const mt::DType xdtype : {mt::DType::f32, mt::DType::bf16, mt::DType::f16}) {
    SCOPED_TRACE(mt::dtype_name(xdtype));
    mt::manual_seed(12);
    const Tensor x = mt::randn({N, C}).to(xdtype), w = mt::randn({V, C}) * 0.3;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(N));
    for (std::int64_t i = 0; i < N; ++i) ids[static_cast<std::size_t>(i)] = (i * 5 + 1) % V;
    const Tensor t = mt::tensor(ids, {N});
    // dx and dW of the head on `device`, with the backward's seed 0.5 declared or not.
    const auto grads = [&](Device device, bool declared) {
      Tensor xl = x.to(device).set_requires_grad(true), wl = w.to(device).set_requires_grad(true);
      Tensor loss;
      {
        std::optional<mt::amp::Autocast> cast;
        std::optional<mt::ops::HeadGemmsInComputeDtype> narrow_gemms;
        if (xdtype != mt::DType::f32) {
          cast.emplace(xdtype);
          narrow_gemms.emplace();
        }
        std::optional<mt::ops::LossGradientSeed> seed;
        if (declared) seed.emplace(0.5);
        loss = mt::ops::fused_linear_cross_entropy(xl, wl, Tensor(), t.to(device), mt::ops::Reduction::mean, -100,
                                                   chunk);
      }
      loss.backward(mt::full({}, 0.5, mt::DType::f32, device));
      const auto flat = [](const Tensor& g) {
        const Tensor c = g.detach().to(Device::cpu()).to(mt::DType::f32).contiguous();
        return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
      };
      return std::vector<std::vector<float>>{flat(xl.grad()), flat(wl.grad())};
    };
    const auto in_forward = grads(dev, true), recomputed = grads(dev, false), cpu = grads(Device::cpu(), true);
    EXPECT_EQ(in_forward, recomputed);
    const double tol = xdtype == mt::DType::f32 ? 1e-5 : 3e-2;
    EXPECT_LT(rel_diff({in_forward[0]}, {cpu[0]}), tol);
    EXPECT_LT(rel_diff({in_forward[1]}, {cpu[1]}), tol);
  }
}

struct Variant {
  std::string name;
  std::function<void(TrainerConfig&)> configure;
  std::string checkpointing = "none";
  double dropout = 0.0;
  // Relative tolerance on each step's loss. f32: the same math in another summation order (cuBLAS, the CUDA
  // reductions) drifts by ~1e-6 over a few steps. 8-bit state and GaLore's SVD can flip a rounding decision,
  // so they get 1e-3; bf16 rounds activations to 8 bits, and the two devices round different sums, so 1e-2.
  double tolerance = 1e-4;
};

std::vector<double> run_steps(const Variant& v, const std::string& device, std::int64_t steps,
                              std::vector<std::vector<float>>* final_values = nullptr) {
  TrainerConfig c = base_config();
  v.configure(c);
  c.device = mt::train::device_from_name(device);
  c.activation_checkpointing = mt::ckpt::Policy::parse(v.checkpointing);
  auto gpt = make_gpt(v.dropout);
  auto ds = std::make_shared<TokenDataset>(40, 16, 64);
  Trainer t(c, gpt, gpt_loss(gpt), ds);
  std::vector<double> out;
  for (std::int64_t s = 0; s < steps; ++s) out.push_back(t.train_step().loss);
  if (final_values) *final_values = values(*gpt);
  return out;
}

TEST(CudaTrainer, GptTrainsLikeTheCpuWithEveryTechnique) {
  SKIP_WITHOUT_CUDA();
  const std::vector<Variant> variants = {
      {"adamw", [](TrainerConfig&) {}},
      {"adamw+clip+accum", [](TrainerConfig& c) {
         c.grad_clip = 0.05;  // small enough that every step clips
         c.grad_accum = 3;
       }},
      {"adamw8bit", [](TrainerConfig& c) {
         c.optimizer = mt::optim::Spec::adamw8bit({.lr = 3e-3, .weight_decay = 0.1, .min_8bit_size = 256});
       }, "none", 0.0, 1e-3},
      {"galore8bit", [](TrainerConfig& c) {
         c.optimizer = mt::optim::Spec::adamw8bit({.lr = 3e-3, .weight_decay = 0.1, .min_8bit_size = 256});
         c.galore_rank = 4;
         c.galore_update_gap = 2;
       }, "none", 0.0, 1e-3},
      {"checkpoint-full", [](TrainerConfig&) {}, "full"},
      {"checkpoint-selective", [](TrainerConfig&) {}, "selective"},
      {"layerwise+clip", [](TrainerConfig& c) {
         c.layerwise_update = true;
         c.grad_clip = 0.05;
       }},
      {"dropout", [](TrainerConfig&) {}, "none", 0.1},
      {"bf16", [](TrainerConfig& c) { c.precision = mt::amp::Precision::bf16; }, "none", 0.0, 1e-2},
      // fp16 with the dynamic loss scaler: gradients unscaled on the device (cuda::amax decides finiteness).
      {"fp16", [](TrainerConfig& c) { c.precision = mt::amp::Precision::fp16; }, "none", 0.0, 1e-2},
      {"fp16+adamw8bit+full", [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::fp16;
         c.optimizer = mt::optim::Spec::adamw8bit({.lr = 3e-3, .weight_decay = 0.1, .min_8bit_size = 256});
         c.grad_accum = 2;
       }, "full", 0.0, 1e-2},
      // fp8: a one-ulp difference in a bf16 input can move an E4M3 code by one step (12.5% of that element), so
      // the two devices' losses agree less closely than bf16's; 2e-2 still separates a broken path (the loss
      // of a wrong product or scale is off by far more).
      {"fp8-delayed", [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::fp8;
         c.fp8_scaling = mt::amp::Fp8ScalingKind::delayed;
       }, "none", 0.0, 2e-2},
      {"fp8-blockwise+selective", [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::fp8;
         c.fp8_scaling = mt::amp::Fp8ScalingKind::blockwise;
       }, "selective", 0.0, 2e-2},
      {"bf16+galore8bit+selective", [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::bf16;
         c.optimizer = mt::optim::Spec::adamw8bit({.lr = 3e-3, .weight_decay = 0.1, .min_8bit_size = 256});
         c.galore_rank = 4;
         c.galore_update_gap = 2;
         c.grad_accum = 2;
       }, "selective", 0.0, 1e-2},
  };
  constexpr std::int64_t kSteps = 5;
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    std::vector<std::vector<float>> p_cpu, p_dev;
    const std::vector<double> cpu = run_steps(v, "cpu", kSteps, &p_cpu);
    const std::vector<double> dev = run_steps(v, "cuda", kSteps, &p_dev);
    ASSERT_EQ(cpu.size(), dev.size());
    for (std::size_t s = 0; s < cpu.size(); ++s) {
      ASSERT_TRUE(std::isfinite(dev[s])) << "step " << s + 1;
      EXPECT_NEAR(dev[s], cpu[s], v.tolerance * std::abs(cpu[s])) << "step " << s + 1;
    }
    EXPECT_LT(cpu.back(), cpu.front()) << "the run must learn for the comparison to mean much";
    const double d = rel_diff(p_dev, p_cpu);
    std::printf("%-28s loss cpu %.6f cuda %.6f after %lld steps, parameters differ by %.2e (relative)\n",
                v.name.c_str(), cpu.back(), dev.back(), static_cast<long long>(kSteps), d);
    EXPECT_LT(d, 10 * v.tolerance);
  }
}

// A LLaMA (RMSNorm, rotary embeddings, SwiGLU, untied head) on the device against the CPU: the loss and every
// parameter's gradient of one forward and backward, in f32 and under bf16 / f16 autocast. Head dim 32, one the
// CUDA attention kernels take. Tolerances as in the Trainer comparison above (f32: summation order; narrow: one
// rounding of each activation on either side).
TEST(CudaTrainer, LlamaLossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  mt::nn::LlamaConfig config;
  config.vocab_size = 64;
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 64;
  config.intermediate_size = 96;
  auto ds = std::make_shared<TokenDataset>(8, 16, 64);
  const mt::data::Batch batch = ds->collate({0, 1, 2});
  const auto grads = [](const mt::nn::Module& m) {
    std::vector<std::vector<float>> out;
    for (const auto& [name, p] : m.named_parameters()) {
      const Tensor c = p.grad().detach().to(Device::cpu()).to(mt::DType::f32).contiguous();
      out.emplace_back(c.data<float>(), c.data<float>() + c.numel());
    }
    return out;
  };
  for (const mt::DType compute : {mt::DType::f32, mt::DType::bf16, mt::DType::f16}) {
    SCOPED_TRACE(mt::dtype_name(compute));
    const auto run = [&](Device device) {
      mt::manual_seed(21);
      auto model = std::make_shared<mt::nn::Llama>(config);
      model->to(device);
      Tensor loss;
      {
        mt::amp::Autocast autocast(compute);
        loss = model->loss(batch.inputs.to(device), batch.targets.to(device));
      }
      loss.backward();
      return std::make_pair(loss.to(Device::cpu()).item(), grads(*model));
    };
    const auto [loss_cpu, grads_cpu] = run(Device::cpu());
    const auto [loss_dev, grads_dev] = run(Device::cuda(0));
    const double tol = compute == mt::DType::f32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(loss_dev, loss_cpu, tol * std::abs(loss_cpu));
    EXPECT_LT(rel_diff(grads_dev, grads_cpu), 10 * tol);
  }
}

// A checkpoint written by a device run resumes on the device: the continued losses equal the uninterrupted
// run's (to f32 rounding: the device kernels are deterministic, but say so only as tightly as needed).
TEST(CudaTrainer, CheckpointResumesOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  mt::test_support::TempDir dir;
  TrainerConfig c = base_config();
  c.device = Device::cuda(0);
  c.checkpoint_dir = dir.path();
  c.grad_clip = 0.5;
  c.max_steps = 6;
  auto ds = std::make_shared<TokenDataset>(40, 16, 64);
  std::vector<double> full;
  {
    auto gpt = make_gpt(0.1);
    Trainer t(c, gpt, gpt_loss(gpt), ds);
    for (int s = 0; s < 6; ++s) full.push_back(t.train_step().loss);
  }
  {
    auto gpt = make_gpt(0.1);
    Trainer t(c, gpt, gpt_loss(gpt), ds);
    for (int s = 0; s < 3; ++s) t.train_step();
    t.save_checkpoint();
  }
  mt::manual_seed(99);
  auto gpt = std::make_shared<mt::nn::GPT>(small_gpt(0.1));
  Trainer t(c, gpt, gpt_loss(gpt), ds);
  ASSERT_TRUE(t.resume_latest());
  EXPECT_EQ(gpt->device(), Device::cuda(0));
  for (int s = 3; s < 6; ++s) EXPECT_NEAR(t.train_step().loss, full[s], 1e-6 * full[s]) << "step " << s + 1;
}

// fit() on the device: the summary names the device and reports its allocator's peak (parameters, optimizer
// state and activations live there) next to the host's.
TEST(CudaTrainer, FitReportsTheDeviceAllocator) {
  SKIP_WITHOUT_CUDA();
  TrainerConfig c = base_config();
  c.device = Device::cuda(0);
  c.max_steps = 2;
  auto gpt = make_gpt();
  auto ds = std::make_shared<TokenDataset>(40, 16, 64);
  Trainer t(c, gpt, gpt_loss(gpt), ds);
  const mt::train::RunSummary s = t.fit();
  EXPECT_EQ(s.device, "cuda:0");
  std::size_t param_bytes = 0;
  for (const auto& [name, p] : gpt->named_parameters()) param_bytes += p.nbytes();
  EXPECT_GE(s.peak_bytes_by_category.at("parameters"), param_bytes);
  EXPECT_GE(s.peak_bytes_by_category.at("optimizer_state"), 2 * param_bytes) << "AdamW's two moments";
  EXPECT_GE(s.peak_bytes_total, 4 * param_bytes) << "parameters, two moments and (by the end of backward) gradients";
  EXPECT_GT(s.host_peak_bytes, 0u) << "the batches are made on the host";
  EXPECT_EQ(s.to_json()["device"], "cuda:0");
}

}  // namespace
