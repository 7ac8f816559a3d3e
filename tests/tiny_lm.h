// What the Trainer-level tests share: the tiny GPT and LLaMA they train (vocabulary 64, windows of 16, two
// layers of width 32), their losses, and a short-run TrainerConfig (micro-batch 4, no periodic eval, constant
// lr, no prefetch unless asked).
#pragma once

#include "memtrain/nn/gpt.h"
#include "memtrain/nn/llama.h"
#include "memtrain/train/trainer.h"
#include "memtrain/train/trainer_config.h"

#include <cstdint>
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

}  // namespace memtrain::test_support
