// Dropout with a mask that is never stored. Element i keeps its value iff Philox lane (i % 4) of block
// (state.offset + i / 4) under key state.seed is >= threshold = round(p * 2^32) (so P(keep) = 1 - p up to
// 2^-32); kept values are scaled by 1 / (1 - p). The backward regenerates the same mask from the same
// state, so the forward saves nothing but the RngState. A CUDA kernel using the same rule matches bit for bit.
#pragma once

#include "memtrain/core/rng.h"

#include <cstdint>

namespace memtrain::cpu {

// Philox blocks one call with n elements draws (reserve this many from the stream).
inline uint64_t dropout_rng_blocks(int64_t n) { return static_cast<uint64_t>((n + 3) / 4); }

template <typename T>
void dropout_forward(T* out, const T* x, int64_t n, double p, RngState state);  // out, x: (n)
template <typename T>
void dropout_backward(T* dx, const T* dout, int64_t n, double p, RngState state);  // same mask as forward

}  // namespace memtrain::cpu
