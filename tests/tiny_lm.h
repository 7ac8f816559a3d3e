// What the Trainer-level tests share: the tiny GPT and LLaMA they train (vocabulary 64, windows of 16, two
// layers of width 32), their losses, a short-run TrainerConfig (micro-batch 4, no periodic eval, constant
// lr, no prefetch unless asked), and the measurement train::predict_memory is held to.
#pragma once

#include "memtrain/core/allocator.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/llama.h"
#include "memtrain/train/predict.h"
#include "memtrain/train/trainer.h"
#include "memtrain/train/trainer_config.h"

#include "token_dataset.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>

namespace memtrain::test_support {

constexpr std::int64_t kTinyVocab = 64, kTinyWindow = 16;

inline std::shared_ptr<nn::Module> make_tiny_lm(bool llama) {
  if (llama) {
    nn::LlamaConfig c;
    c.vocab_size = kTinyVocab;
    c.block_size = kTinyWindow;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.intermediate_size = 64;
    return std::make_shared<nn::Llama>(c);
  }
  nn::GPTConfig c;
  c.vocab_size = kTinyVocab;
  c.block_size = kTinyWindow;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return std::make_shared<nn::GPT>(c);
}

inline train::LossFn tiny_lm_loss(const std::shared_ptr<nn::Module>& model, bool llama) {
  if (llama) {
    auto m = std::static_pointer_cast<nn::Llama>(model);
    return [m](const data::Batch& b) { return m->loss(b.inputs, b.targets); };
  }
  auto m = std::static_pointer_cast<nn::GPT>(model);
  return [m](const data::Batch& b) { return m->loss(b.inputs, b.targets); };
}

inline train::TrainerConfig short_run_config(std::int64_t prefetch = 0) {
  train::TrainerConfig c;
  c.micro_batch = 4;
  c.max_steps = 10;
  c.eval_interval = 0;
  c.eval_batches = 2;
  c.log_interval = 1000;
  c.data.prefetch = prefetch;
  c.schedule.decay = train::LrDecay::constant;
  c.seed = 5;
  return c;
}

// The tiny model as a prediction's inputs: 32 training and 12 validation windows.
inline train::RunInputs inputs_for(bool llama) {
  train::RunInputs in;
  in.make_model = [llama] { return make_tiny_lm(llama); };
  in.make_loss = [llama](const std::shared_ptr<nn::Module>& m) { return tiny_lm_loss(m, llama); };
  in.train = std::make_shared<TokenDataset>(32, kTinyWindow, kTinyVocab);
  in.val = std::make_shared<TokenDataset>(12, kTinyWindow, kTinyVocab);
  return in;
}

// What the CPU allocator measured over the steps a prediction covers, from before the model was built.
struct Measured {
  std::size_t peak_total = 0;
  std::array<std::size_t, kNumMemoryCategories> at_peak{}, own_peak{};
};

// `config` trained on the CPU for what a prediction runs: two optimizer steps and an evaluation. `attach`, when
// given, is called on the trainer first (a data-parallel run: dist::attach_data_parallel).
inline Measured measure_on_cpu(const train::TrainerConfig& config, bool llama,
                               const std::function<void(train::Trainer&)>& attach = nullptr) {
  const train::RunInputs in = inputs_for(llama);
  Allocator& cpu = Allocator::get(Device::cpu());
  const MemoryStats before = cpu.stats();
  Measured m;
  auto model = in.make_model();
  train::Trainer trainer(config, model, in.make_loss(model), in.train, in.val);  // resets the peak
  if (attach) attach(trainer);
  trainer.train_step();
  trainer.train_step();
  trainer.evaluate();
  const MemoryStats after = cpu.stats();
  m.peak_total = after.peak_bytes - before.live_bytes;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    m.at_peak[i] = after.by_category[i].at_total_peak - before.by_category[i].live_bytes;
    m.own_peak[i] = after.by_category[i].peak_bytes - before.by_category[i].live_bytes;
  }
  return m;
}

}  // namespace memtrain::test_support
