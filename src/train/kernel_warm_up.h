// The resident set a CPU training step brings into a process beyond its tensors: the code pages of the
// kernels it runs, oneDNN's JIT kernels, the OpenMP thread pool. A prediction on the meta device runs no
// kernel, so before it reads its baseline RSS (train/predict.h) it warms those up with warm_up_cpu_kernels.
#pragma once

#include "memtrain/train/trainer_config.h"

#include <cstdint>
#include <string>

namespace memtrain::train::detail {

// Trains a small GPT (2 layers of width 64, vocabulary 128) for two steps on the CPU under `config`'s precision,
// parameter dtype, optimizer, GaLore, checkpointing, layer-wise and LoRA settings and its micro-batch x
// accumulation, on windows of `window` tokens (clamped to [16, 1024]; oneDNN chooses its kernels by the GEMMs'
// rows), on one rank, writing no file. Once per process for each distinct set of those (their code stays
// resident). Leaves the default RNG stream as it was and empties the CPU allocator's cache after it; like any
// Trainer, it resets the CPU allocator's peak, so a process that trains already does not call it.
// Returns false, with the reason in `why`, when the small model cannot take `config` (the baseline is then read
// without it).
bool warm_up_cpu_kernels(const TrainerConfig& config, std::int64_t window, std::string& why);

}  // namespace memtrain::train::detail
