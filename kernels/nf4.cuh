// Launcher for the NF4 dequantisation kernel (nf4.cu); the format is memtrain/ops/nf4.h's.
// Plain C++-callable: raw device pointers, a block range, a stream; enqueues nothing when there is no work and
// returns cudaGetLastError().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace memtrain::cuda {

// The 16 NF4 levels and the 256 values of the signed dynamic map, filled by the host from the tables the CPU
// uses and passed by value as a kernel parameter (1.1 KiB): nothing to upload, and one copy of each table.
struct Nf4Tables {
  float levels[16];
  float absmax_map[256];
};

// Elements [64 first_block, 64 (first_block + blocks)) into out: f32, or bf16 bits when bf16. absmax of block b
// = absmax_map[absmax_codes[b]] * scales[b / 256] + mean, each step rounded (no FMA), as on the CPU.
cudaError_t launch_nf4_dequantize(const std::uint8_t* codes, const std::uint8_t* absmax_codes, const float* scales,
                                  const Nf4Tables& tables, float mean, std::int64_t first_block, std::int64_t blocks,
                                  void* out, bool bf16, cudaStream_t stream);

}  // namespace memtrain::cuda
