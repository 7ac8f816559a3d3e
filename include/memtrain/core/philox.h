// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based
// generator. Output block c of key k is a pure function of (k, c), so any element of a stream can be
// produced on its own, by any thread, on the CPU or a GPU, and a recomputation replays it exactly.
// Header-only and dependency-free so CUDA kernels can include it too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MEMTRAIN_HD __host__ __device__
#define MEMTRAIN_UNROLL _Pragma("unroll")
#else
#define MEMTRAIN_HD
#define MEMTRAIN_UNROLL
#endif

namespace memtrain {

struct Philox4x32 {
  std::uint32_t v[4];
};

MEMTRAIN_HD inline Philox4x32 philox4x32_10(std::uint64_t counter_lo, std::uint64_t counter_hi, std::uint64_t key) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::uint32_t c0 = static_cast<std::uint32_t>(counter_lo), c1 = static_cast<std::uint32_t>(counter_lo >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(counter_hi), c3 = static_cast<std::uint32_t>(counter_hi >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  MEMTRAIN_UNROLL
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: never 0, so log() of it is finite. 24 random bits.
MEMTRAIN_HD inline float uint_to_unit_float(std::uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

}  // namespace memtrain
