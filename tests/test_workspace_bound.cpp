// Bounded workspace: the optimizers' temporaries, GaLore's projections and its projector refreshes (randomized
// and exact SVD) work in pieces, so that a training step's workspace peak stays within max(64 MiB, the largest
// single parameter's bytes), whatever the model's size. Measured on the meta backend (the CPU's byte accounting,
// no data) for gpt2-124M's shapes (12 layers of width 768, a 50257-token vocabulary) through train::predict_memory:
// two optimizer steps (the first one makes the state and GaLore's first projectors) and an evaluation.
#include <gtest/gtest.h>

#include "memtrain/nn/gpt.h"
#include "memtrain/optim/spec.h"
#include "memtrain/train/predict.h"

#include "token_dataset.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mt = memtrain;

namespace {

using mt::train::TrainerConfig;

constexpr std::int64_t kWindow = 32;
constexpr std::size_t kMiB = std::size_t{1} << 20;

mt::nn::GPTConfig gpt2_124m_shapes() {
  mt::nn::GPTConfig c = mt::nn::GPTConfig::preset("gpt2-124M");
  c.block_size = kWindow;  // short windows: the activations do not matter here, the weights' shapes do
  return c;
}

mt::train::RunInputs gpt2_inputs() {
  mt::train::RunInputs in;
  in.make_model = [] { return std::make_shared<mt::nn::GPT>(gpt2_124m_shapes()); };
  in.make_loss = [](const std::shared_ptr<mt::nn::Module>& m) {
    auto gpt = std::static_pointer_cast<mt::nn::GPT>(m);
    return [gpt](const mt::data::Batch& b) { return gpt->loss(b.inputs, b.targets); };
  };
  in.train = std::make_shared<mt::test_support::TokenDataset>(8, kWindow, 50257);
  return in;
}

struct Case {
  std::string name;
  std::function<void(TrainerConfig&)> configure;
};

std::vector<Case> cases() {
  using mt::optim::Spec;
  const auto galore = [](TrainerConfig& c) {
    c.galore_rank = 128;
    c.galore_update_gap = 1;  // the second step refreshes the projectors too
  };
  return {
      {"adamw", [](TrainerConfig&) {}},
      {"adamw8bit", [](TrainerConfig& c) { c.optimizer = Spec::adamw8bit({}); }},
      {"lion8bit bf16", [](TrainerConfig& c) {
         c.optimizer = Spec::lion8bit({});
         c.precision = mt::amp::Precision::bf16;
       }},
      {"adafactor", [](TrainerConfig& c) { c.optimizer = Spec::adafactor({}); }},
      {"adafactor, bf16 weights", [](TrainerConfig& c) {
         c.optimizer = Spec::adafactor({});
         c.precision = mt::amp::Precision::bf16;
         c.param_dtype = mt::amp::ParamDtype::bf16;
       }},
      {"galore adamw (randomized svd)", galore},
      {"galore adamw (exact svd)", [galore](TrainerConfig& c) {
         galore(c);
         c.galore_svd = mt::optim::GaLoreSvd::exact;
       }},
      {"galore adamw8bit layer-wise", [galore](TrainerConfig& c) {
         galore(c);
         c.optimizer = Spec::adamw8bit({});
         c.layerwise_update = true;
       }},
      {"the recipe: bf16 weights, adamw8bit, galore, layer-wise, full checkpointing", [galore](TrainerConfig& c) {
         galore(c);
         c.optimizer = Spec::adamw8bit({});
         c.layerwise_update = true;
         c.precision = mt::amp::Precision::bf16;
         c.param_dtype = mt::amp::ParamDtype::bf16;
         c.activation_checkpointing = mt::ckpt::Policy::full();
       }},
  };
}

TEST(WorkspaceBound, EveryOptimizerStaysWithin64MiBOrTheLargestParameter) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    TrainerConfig c;
    c.micro_batch = 2;
    c.max_steps = 10;
    c.eval_interval = 0;
    c.seed = 3;
    k.configure(c);
    const mt::train::MemoryPrediction p = mt::train::predict_memory(c, gpt2_inputs());
    // The largest parameter: the tied token table, V x C in the parameters' storage dtype.
    const std::size_t param_bytes = c.param_dtype == mt::amp::ParamDtype::f32 ? 4 : 2;
    const std::size_t largest = std::size_t{50257} * 768 * param_bytes;
    const std::size_t workspace = p.category_peak_bytes.at("workspace");
    std::printf("%-78s workspace peak %7.1f MiB (bound %.1f MiB)\n", k.name.c_str(),
                static_cast<double>(workspace) / kMiB, static_cast<double>(std::max(64 * kMiB, largest)) / kMiB);
    EXPECT_GT(workspace, 0u) << "the step ran and used some workspace";
    EXPECT_LE(workspace, std::max(64 * kMiB, largest));
  }
}

}  // namespace
