// Factories for the 8-bit optimizers, so callers need only this header and the Optimizer interface.
// Tensors with at least min_8bit_size elements keep block-wise 8-bit state (blocks of block_size
// elements); smaller ones (biases, norms) keep fp32 state, where 8 bits would save little and cost accuracy.
#pragma once

#include "memtrain/optim/adamw.h"
#include "memtrain/optim/optimizer.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace memtrain::optim {

std::unique_ptr<Optimizer> make_adamw8bit(std::vector<ParamGroup> groups, std::int64_t block_size = 256,
                                          std::int64_t min_8bit_size = 4096, AdamEpsMode eps_mode = AdamEpsMode::torch);
std::unique_ptr<Optimizer> make_lion8bit(std::vector<ParamGroup> groups, std::int64_t block_size = 256,
                                         std::int64_t min_8bit_size = 4096);

}  // namespace memtrain::optim
