// Optimizer steps and gradient utilities on the meta device: a few steps of each optimizer (AdamW, SGD, Lion;
// the 8-bit AdamW and Lion, Adafactor, GaLore's projector), the finite-gradient gate and the gradient norm
// must allocate, per memory category, exactly the bytes they allocate on the CPU (src/meta/,
// src/cpu/optim_*.cpp, src/cpu/galore_linalg.cpp).
// Meta reads as zeros: a gradient norm is 0 there (no clipping) and every gradient is finite.
#include <gtest/gtest.h>

#include "meta_footprint.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/optim/adafactor.h"
#include "memtrain/optim/adamw.h"
#include "memtrain/optim/adamw8bit.h"
#include "memtrain/optim/galore_projector.h"
#include "memtrain/optim/lion8bit.h"
#include "memtrain/optim/lion.h"
#include "memtrain/optim/sgd.h"
#include "memtrain/train/trainer.h"

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>

namespace memtrain {
namespace {

using test_support::expect_same_footprint;
using test_support::Footprint;

std::size_t at(const std::array<std::size_t, kNumMemoryCategories>& a, MemoryCategory c) {
  return a[static_cast<std::size_t>(c)];
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

struct OptimCase {
  std::string name;
  MakeOptimizer make;
  int state_per_param;  // f32 state tensors of the parameter's shape
};

std::vector<OptimCase> optimizer_cases() {
  return {
      {"AdamW", [](auto g) { return std::make_unique<optim::AdamW>(std::move(g)); }, 2},
      {"SGD momentum", [](auto g) { return std::make_unique<optim::SGD>(std::move(g)); }, 1},
      {"SGD nesterov", [](auto g) { return std::make_unique<optim::SGD>(std::move(g), /*nesterov=*/true); }, 1},
      {"SGD plain",
       [](auto g) {
         for (auto& group : g) group.beta1 = 0.0;
         return std::make_unique<optim::SGD>(std::move(g));
       },
       0},
      {"Lion", [](auto g) { return std::make_unique<optim::Lion>(std::move(g)); }, 1},
  };
}

// A [64, 48] weight and a [48] bias, counted as parameters.
std::pair<Tensor, Tensor> make_params(Device dev) {
  CategoryGuard params(MemoryCategory::parameters);
  return {randn({64, 48}, DType::f32, dev).set_requires_grad(true), randn({48}, DType::f32, dev).set_requires_grad(true)};
}

// The gradient of a [64, 48] parameter: contiguous in `dtype`, or a transposed view.
Tensor make_grad(DType dtype, bool transposed, Device dev) {
  return transposed ? randn({48, 64}, dtype, dev).t() : randn({64, 48}, dtype, dev);
}

// Three steps of each optimizer, state created lazily at the first: f32 parameters with f32, bf16, f16 and
// f64 gradients, contiguous or transposed (the backend converts them to the f32 its kernel reads).
TEST(MetaOptim, StepsMatchCpuBytes) {
  for (const OptimCase& oc : optimizer_cases()) {
    for (const DType gdtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      for (const bool transposed : {false, true}) {
        const std::string what = oc.name + " grad " + std::string(dtype_name(gdtype)) + (transposed ? " transposed" : "");
        const Footprint cpu = expect_same_footprint(what, [&](Device dev) {
          auto [w, b] = make_params(dev);
          auto opt = oc.make({optim::ParamGroup{{w, b}, 1e-3, 0.1}});
          EXPECT_EQ(opt->state_bytes(), 0u) << what << ": state is created at the first step";
          for (int step = 0; step < 3; ++step) {
            {
              CategoryGuard grads(MemoryCategory::gradients);
              w.set_grad(make_grad(gdtype, transposed, dev));
              b.set_grad(randn({48}, gdtype, dev));
            }
            const optim::StepReport report = opt->step();
            EXPECT_EQ(report.updated, 2) << what;
            EXPECT_EQ(report.skipped_nonfinite, 0) << what;
          }
          EXPECT_EQ(opt->state_bytes(), static_cast<std::size_t>(oc.state_per_param) * 4 * (64 * 48 + 48)) << what;
        });
        EXPECT_EQ(at(cpu.peak, MemoryCategory::optimizer_state),
                  static_cast<std::size_t>(oc.state_per_param) * 4 * (64 * 48 + 48))
            << what << ": the state is allocated under optimizer_state on the parameter's device";
        if (gdtype != DType::f32 || transposed) {
          EXPECT_GT(at(cpu.peak, MemoryCategory::workspace), 0u) << what << ": the f32 copy of the gradient";
        }
      }
    }
  }
}

// A bf16 parameter (no f32 master) steps through an f32 copy and is rounded back (optim::NarrowParams): on meta
// with the CPU's bytes per category, stochastically or with Kahan's compensation (2 bytes per element of state).
TEST(MetaOptim, Bf16ParametersStepWithTheCpusBytes) {
  for (const OptimCase& oc : optimizer_cases()) {
    for (const bool kahan : {false, true}) {
      const std::string what = oc.name + (kahan ? " kahan" : " stochastic");
      const Footprint cpu = expect_same_footprint(what, [&](Device dev) {
        Tensor w;
        {
          CategoryGuard params(MemoryCategory::parameters);
          w = randn({8, 4}, DType::bf16, dev).set_requires_grad(true);
        }
        auto opt = oc.make({optim::ParamGroup{{w}}});
        opt->set_narrow_params({.seed = 3, .kahan = kahan});
        for (int step = 0; step < 2; ++step) {
          CategoryGuard grads(MemoryCategory::gradients);
          w.set_grad(randn({8, 4}, DType::bf16, dev));
          EXPECT_EQ(opt->step().updated, 1) << what;
        }
        EXPECT_EQ(w.dtype(), DType::bf16) << what;
        EXPECT_EQ(opt->compensation_bytes(), kahan ? 2u * 32u : 0u) << what;
      });
      EXPECT_EQ(at(cpu.peak, MemoryCategory::optimizer_state),
                (static_cast<std::size_t>(oc.state_per_param) * 4 + (kahan ? 2 : 0)) * 32)
          << what;
      EXPECT_GE(at(cpu.peak, MemoryCategory::workspace), 4u * 32u) << what << ": the f32 copy of the parameter";
    }
  }
}

// The finite gate reads the gradient: on the CPU a NaN gradient is skipped with no state made; on meta the
// gradient reads as zeros, so it is finite and the step runs (the documented answer for data).
TEST(MetaOptim, FiniteGateReadsZerosOnMeta) {
  for (const Device dev : {Device::cpu(), Device::meta()}) {
    Tensor w = zeros({16}, DType::f32, dev).set_requires_grad(true);
    w.set_grad(full({16}, std::numeric_limits<double>::quiet_NaN(), DType::bf16, dev));
    optim::AdamW opt({optim::ParamGroup{{w}}});
    const optim::StepReport report = opt.step();
    EXPECT_EQ(report.skipped_nonfinite, dev.is_cpu() ? 1 : 0) << dev.str();
    EXPECT_EQ(report.updated, dev.is_cpu() ? 0 : 1) << dev.str();
    EXPECT_EQ(opt.state_bytes(), dev.is_cpu() ? 0u : 2u * 4u * 16u) << dev.str();
  }
  expect_same_footprint("finite gate on a bf16 gradient", [](Device dev) {
    Tensor w = zeros({300}, DType::f32, dev).set_requires_grad(true);
    CategoryGuard grads(MemoryCategory::gradients);
    w.set_grad(randn({300}, DType::bf16, dev));
    optim::SGD opt({optim::ParamGroup{{w}, 0.1}});
    EXPECT_EQ(opt.step().updated, 1);
  });
}

// The global gradient norm over f32, bf16, f64 and transposed gradients: the same converted copies on meta,
// where the norm is 0, so clip_grad_norm returns 0 and scales nothing.
TEST(MetaOptim, GradNormMatchesCpuBytesAndIsZeroOnMeta) {
  const Footprint cpu = expect_same_footprint("global_grad_norm", [](Device dev) {
    std::vector<Tensor> params;
    {
      CategoryGuard p(MemoryCategory::parameters);
      for (const DType dtype : {DType::f32, DType::bf16, DType::f64, DType::f16})
        params.push_back(zeros({64, 48}, dtype, dev).set_requires_grad(true));
      params.push_back(zeros({64, 48}, DType::f32, dev).set_requires_grad(true));
      params.push_back(zeros({5}, DType::f32, dev).set_requires_grad(true));  // no gradient
    }
    {
      CategoryGuard g(MemoryCategory::gradients);
      for (std::size_t i = 0; i + 2 < params.size(); ++i) params[i].set_grad(randn({64, 48}, params[i].dtype(), dev));
      params[4].set_grad(randn({48, 64}, DType::f32, dev).t());
    }
    const double norm = train::global_grad_norm(params);
    const double clipped = train::clip_grad_norm(params, 1e30);  // large: the CPU does not scale either
    EXPECT_EQ(norm, clipped);
    if (dev.is_meta()) {
      EXPECT_EQ(norm, 0.0);
    } else {
      EXPECT_GT(norm, 100.0);  // ~sqrt(5 * 3072)
    }
  });
  EXPECT_GT(at(cpu.peak, MemoryCategory::workspace), 0u) << "the f32 copies of the bf16, f16 and transposed grads";

  // On meta a norm of 0 never exceeds max_norm: no clipping.
  Tensor w = zeros({8}, DType::f32, Device::meta()).set_requires_grad(true);
  w.set_grad(full({8}, 1e6, DType::f32, Device::meta()));
  EXPECT_EQ(train::clip_grad_norm({w}, 1.0), 0.0);
}

// The optimizers with other state kinds: 8-bit block-wise moments (a [64, 48] weight quantized, its [48]
// bias below min_8bit_size in f32), Adafactor's factored (weight) and vector (bias) second moments with and
// without a first moment. Three steps on f32 and on transposed bf16 gradients must allocate on meta, per
// category, exactly the CPU's bytes (the state, the gradient copy, Adafactor's update workspace).
TEST(MetaOptim, StateKindStepsMatchCpuBytes) {
  const std::vector<OptimCase> cases = {
      {"AdamW8bit", [](auto g) { return std::make_unique<optim::AdamW8bit>(std::move(g), 256, 256); }, 0},
      {"Lion8bit", [](auto g) { return std::make_unique<optim::Lion8bit>(std::move(g), 128, 256); }, 0},
      {"Adafactor", [](auto g) { return std::make_unique<optim::Adafactor>(std::move(g)); }, 0},
      {"Adafactor first moment",
       [](auto g) {
         optim::AdafactorOptions o;
         o.use_first_moment = true;
         return std::make_unique<optim::Adafactor>(std::move(g), o);
       },
       0},
  };
  for (const OptimCase& oc : cases) {
    for (const bool narrow : {false, true}) {
      const std::string what = oc.name + (narrow ? " bf16 transposed grad" : " f32 grad");
      std::size_t state_bytes[2] = {0, 0};
      int run = 0;
      const Footprint cpu = expect_same_footprint(what, [&](Device dev) {
        auto [w, b] = make_params(dev);
        auto opt = oc.make({optim::ParamGroup{{w, b}, 1e-3, 0.1}});
        for (int step = 0; step < 3; ++step) {
          {
            CategoryGuard grads(MemoryCategory::gradients);
            w.set_grad(narrow ? make_grad(DType::bf16, true, dev) : make_grad(DType::f32, false, dev));
            b.set_grad(randn({48}, narrow ? DType::bf16 : DType::f32, dev));
          }
          EXPECT_EQ(opt->step().updated, 2) << what << " on " << dev.str();
        }
        state_bytes[run++] = opt->state_bytes();
      });
      EXPECT_EQ(state_bytes[1], state_bytes[0]) << what << ": state_bytes() on meta";
      EXPECT_EQ(at(cpu.peak, MemoryCategory::optimizer_state), state_bytes[0]) << what;
      EXPECT_GT(state_bytes[0], 0u) << what;
      if (narrow) {
        EXPECT_GT(at(cpu.peak, MemoryCategory::workspace), 0u) << what << ": the f32 gradient copy";
      }
    }
  }
  // The 8-bit layout: codes (1 byte) + absmax per block for the weight, f32 for the bias.
  Tensor w = zeros({64, 48}, DType::f32, Device::meta()).set_requires_grad(true);
  Tensor b = zeros({48}, DType::f32, Device::meta()).set_requires_grad(true);
  w.set_grad(zeros({64, 48}, DType::f32, Device::meta()));
  b.set_grad(zeros({48}, DType::f32, Device::meta()));
  optim::AdamW8bit opt({optim::ParamGroup{{w, b}}}, 256, 256);
  opt.step();
  EXPECT_EQ(opt.state_bytes(), 2u * (3072u + 4u * 12u) + 2u * 4u * 48u);
}

// GaLore's projector on meta: the basis (optimizer_state), the projections and the back-projections allocate
// the CPU's bytes; the SVD has no data there, so the basis reads as zeros, and the projector's own random
// stream advances past the draws the CPU made, so a later refresh draws the CPU's numbers.
TEST(MetaOptim, GaLoreProjectorMatchesCpuBytes) {
  struct Case {
    optim::GaLoreProjType type;
    optim::GaLoreSvd svd;
    std::int64_t m, n;
  };
  const Case cases[] = {{optim::GaLoreProjType::std_side, optim::GaLoreSvd::randomized, 48, 64},
                        {optim::GaLoreProjType::std_side, optim::GaLoreSvd::randomized, 64, 48},
                        {optim::GaLoreProjType::full, optim::GaLoreSvd::randomized, 40, 56},
                        {optim::GaLoreProjType::left, optim::GaLoreSvd::exact, 32, 24}};
  for (const Case& c : cases) {
    const std::string what = std::string("GaLoreProjector ") + optim::galore_proj_type_name(c.type) + " " +
                             optim::galore_svd_name(c.svd) + " " + std::to_string(c.m) + "x" + std::to_string(c.n);
    RngState after[2];
    int run = 0;
    expect_same_footprint(what, [&](Device dev) {
      optim::GaLoreProjectorOptions o;
      o.rank = 4;
      o.update_gap = 2;
      o.proj_type = c.type;
      o.svd = c.svd;
      optim::GaLoreProjector proj(o);
      Tensor W;
      {
        CategoryGuard params(MemoryCategory::parameters);
        W = randn({c.m, c.n}, DType::f32, dev);
      }
      CategoryGuard ws(MemoryCategory::workspace);
      for (std::int64_t step = 0; step < 3; ++step) {  // refreshes at steps 0 and 2 (warm-started)
        const Tensor G = randn({c.m, c.n}, DType::f32, dev);
        Tensor R = proj.project(G, step);
        proj.project_add(randn({c.n, c.m}, DType::f32, dev).t(), R);
        const Tensor back = proj.project_back(R);
        EXPECT_EQ(back.shape(), Shape({c.m, c.n})) << what;
        proj.project_back_add(R, W, 0.9f);
      }
      EXPECT_EQ(proj.refresh_count(), 2) << what;
      after[run++] = proj.rng_state();
    });
    EXPECT_EQ(after[1], after[0]) << what << ": meta advances the projector's stream as the CPU does";
  }
}

}  // namespace
}  // namespace memtrain
