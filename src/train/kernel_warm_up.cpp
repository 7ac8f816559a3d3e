// warm_up_cpu_kernels (train/kernel_warm_up.h).
#include "train/kernel_warm_up.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/data/loader.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/trainer.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>

namespace memtrain::train::detail {

namespace {

// `config` for the small model: one rank, two steps, no files, nothing sized for a larger model.
TrainerConfig small_config(const TrainerConfig& config) {
  TrainerConfig c = config;
  c.device = Device::cpu();
  c.world_size = 1;
  c.zero = 0;
  c.tensor_parallel = 1;
  c.grad_compression = "none";
  c.offload_optimizer = "none";
  c.canonical_reduction = false;
  c.max_steps = 2;
  c.eval_interval = 0;
  c.checkpoint_interval = 0;
  c.checkpoint_dir.clear();
  c.metrics_path.clear();
  c.summary_path.clear();
  c.memory_budget_bytes.reset();
  c.log_interval = 1000;
  if (c.galore_rank > 0) c.galore_rank = 8;
  if (c.lisa_layers > 0) c.lisa_layers = 1;
  if (c.activation_checkpointing.kind == ckpt::Policy::Kind::budget)
    c.activation_checkpointing = ckpt::Policy::budget(std::size_t{64} << 10);
  return c;
}

}  // namespace

bool warm_up_cpu_kernels(const TrainerConfig& config, std::int64_t window, std::string& why) {
  static std::mutex mutex;
  static std::set<std::string> warmed;  // the small configurations run so far
  const TrainerConfig c = small_config(config);
  window = std::clamp<std::int64_t>(window, 16, 1024);
  const std::string key = c.to_json().dump() + std::to_string(window);
  const std::lock_guard lock(mutex);
  if (warmed.count(key) != 0) return true;
  try {
    const RngStateGuard rng;
    nn::GPTConfig g;
    g.vocab_size = 128;
    g.block_size = window;
    g.n_layer = 2;
    g.n_head = 2;
    g.n_embd = 64;
    {
      auto model = std::make_shared<nn::GPT>(g);
      const std::int64_t samples = c.micro_batch * c.grad_accum * 2;
      auto windows =
          std::make_shared<data::BlankDataset>(samples, Shape{g.block_size}, DType::i64, Shape{g.block_size});
      Trainer trainer(c, model, [model](const data::Batch& b) { return model->loss(b.inputs, b.targets); }, windows,
                      nullptr);
      trainer.train_step();
      trainer.train_step();
    }
    Allocator::get(Device::cpu()).empty_cache();
  } catch (const Error& e) {
    Allocator::get(Device::cpu()).empty_cache();
    why = e.what();
    return false;
  }
  warmed.insert(key);
  return true;
}

}  // namespace memtrain::train::detail
