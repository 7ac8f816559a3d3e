// A whole training step on the meta device, through train::Trainer (the real code path): the first step
// (optimizer state made), a steady-state step and an evaluation must account, per category, exactly the
// bytes the same steps account on the CPU — for the GPT and for LLaMA, under each memory technique whose
// kernels are behind the backend contract: every optimizer state kind (8-bit AdamW and Lion, Adafactor,
// GaLore with its SVD reading zeros on meta), FP8 and the fp16 loss scaler (reading "no overflow" on meta).
#include <gtest/gtest.h>

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/optim/spec.h"
#include "memtrain/train/train.h"

#include "tiny_lm.h"
#include "token_dataset.h"

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mt = memtrain;

namespace {

using mt::Device;
using mt::MemoryCategory;
using mt::train::TrainerConfig;

using mt::test_support::kTinyVocab;
using mt::test_support::kTinyWindow;

// The categories a plan is made of (data and other differ by design: the loader's host buffers).
constexpr std::array<MemoryCategory, 6> kCompared = {MemoryCategory::parameters,      MemoryCategory::compute_weights,
                                                     MemoryCategory::gradients,       MemoryCategory::optimizer_state,
                                                     MemoryCategory::activations,     MemoryCategory::workspace};

struct Footprint {
  std::array<std::size_t, mt::kNumMemoryCategories> peak{}, live{};
};

// Two optimizer steps and an evaluation on `device`; the bytes each category reached above what was live once
// the Trainer stood (the model already on the device).
Footprint run(const TrainerConfig& base, bool llama, Device device) {
  TrainerConfig c = base;
  c.device = device;
  mt::manual_seed(21);
  auto model = mt::test_support::make_tiny_lm(llama);
  auto train = std::make_shared<mt::test_support::TokenDataset>(32, kTinyWindow, kTinyVocab);
  auto val = std::make_shared<mt::test_support::TokenDataset>(8, kTinyWindow, kTinyVocab);
  mt::train::Trainer trainer(c, model, mt::test_support::tiny_lm_loss(model, llama), train, val);
  mt::Allocator& alloc = mt::Allocator::get(device);
  const mt::MemoryStats before = alloc.stats();
  alloc.reset_peak();
  trainer.train_step();
  trainer.train_step();
  trainer.evaluate();
  const mt::MemoryStats after = alloc.stats();
  Footprint f;
  for (int i = 0; i < mt::kNumMemoryCategories; ++i) {
    f.peak[i] = after.by_category[i].peak_bytes - before.by_category[i].live_bytes;
    f.live[i] = after.by_category[i].live_bytes - before.by_category[i].live_bytes;
  }
  return f;
}

struct Variant {
  std::string name;
  std::function<void(TrainerConfig&)> configure;
  // False: a technique whose kernels are not behind the backend contract yet; the meta run must refuse it
  // with an error naming meta (never a wrong count). Moving a technique behind the contract flips this.
  bool runs_on_meta = true;
};

std::vector<Variant> variants() {
  using mt::ckpt::Policy;
  using mt::optim::Spec;
  return {
      {"adamw", [](TrainerConfig&) {}},
      {"adamw8bit", [](TrainerConfig& c) { c.optimizer = Spec::adamw8bit({.lr = 1e-3, .min_8bit_size = 256}); }},
      {"lion8bit", [](TrainerConfig& c) { c.optimizer = Spec::lion8bit({.lr = 1e-4, .min_8bit_size = 256}); }},
      {"adafactor", [](TrainerConfig& c) { c.optimizer = Spec::adafactor({.lr = 1e-2}); }},
      {"galore", [](TrainerConfig& c) {
         c.galore_rank = 4;
         c.galore_update_gap = 1;
       }},
      {"galore8bit+accum", [](TrainerConfig& c) {
         c.optimizer = Spec::adamw8bit({.lr = 1e-3, .min_8bit_size = 256});
         c.galore_rank = 4;
         c.grad_accum = 2;
       }},
      {"full", [](TrainerConfig& c) { c.activation_checkpointing = Policy::full(); }},
      {"selective", [](TrainerConfig& c) { c.activation_checkpointing = Policy::selective(); }},
      {"budget", [](TrainerConfig& c) { c.activation_checkpointing = Policy::budget(64 * 1024); }},
      {"accum", [](TrainerConfig& c) { c.grad_accum = 3; }},
      {"layerwise", [](TrainerConfig& c) { c.layerwise_update = true; }},
      {"bf16", [](TrainerConfig& c) { c.precision = mt::amp::Precision::bf16; }},
      {"fp16", [](TrainerConfig& c) { c.precision = mt::amp::Precision::fp16; }},
      {"fp8", [](TrainerConfig& c) { c.precision = mt::amp::Precision::fp8; }},
      {"fp8-delayed", [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::fp8;
         c.fp8_scaling = mt::amp::Fp8ScalingKind::delayed;
       }},
      {"bf16+selective+accum+layerwise", [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::bf16;
         c.activation_checkpointing = Policy::selective();
         c.grad_accum = 2;
         c.layerwise_update = true;
       }},
      {"fp16+full+accum", [](TrainerConfig& c) {
         c.precision = mt::amp::Precision::fp16;
         c.activation_checkpointing = Policy::full();
         c.grad_accum = 2;
       }},
  };
}

void expect_meta_equals_cpu(bool llama) {
  for (const Variant& v : variants()) {
    const std::string what = std::string(llama ? "llama " : "gpt ") + v.name;
    SCOPED_TRACE(what);
    TrainerConfig c = mt::test_support::short_run_config();
    v.configure(c);
    const Footprint cpu = run(c, llama, Device::cpu());
    if (!v.runs_on_meta) {
      try {
        run(c, llama, Device::meta());
        ADD_FAILURE() << what << ": runs on meta now: move it to the compared variants";
      } catch (const mt::Error& e) {
        EXPECT_NE(std::string(e.what()).find("meta"), std::string::npos) << what << ": " << e.what();
      }
      continue;
    }
    Footprint meta;
    try {
      meta = run(c, llama, Device::meta());
    } catch (const mt::Error& e) {
      ADD_FAILURE() << what << ": the step does not run on meta: " << e.what();
      continue;
    }
    EXPECT_GT(cpu.peak[static_cast<int>(MemoryCategory::activations)], 0u) << what << ": nothing was measured";
    EXPECT_GT(cpu.peak[static_cast<int>(MemoryCategory::gradients)], 0u) << what << ": nothing was measured";
    for (const MemoryCategory cat : kCompared) {
      const int i = static_cast<int>(cat);
      EXPECT_EQ(meta.peak[i], cpu.peak[i]) << what << ": peak " << mt::category_name(cat);
      EXPECT_EQ(meta.live[i], cpu.live[i]) << what << ": live " << mt::category_name(cat);
    }
  }
}

TEST(MetaTraining, GptStepAccountsTheCpuBytesUnderEveryTechnique) { expect_meta_equals_cpu(false); }
TEST(MetaTraining, LlamaStepAccountsTheCpuBytesUnderEveryTechnique) { expect_meta_equals_cpu(true); }

}  // namespace
