// NF4 dequantisation: one thread per code byte, which holds elements 2j (high nibble) and 2j + 1 (low nibble)
// of the flattened matrix. Every thread recomputes its block's absmax (two loads, a rounded multiply and add):
// cheaper than a second pass, and the 32 threads of a block share the loads through the cache.
#include "nf4.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;

template <bool Bf16>
__global__ void nf4_dequantize_kernel(const std::uint8_t* __restrict__ codes,
                                      const std::uint8_t* __restrict__ absmax_codes, const float* __restrict__ scales,
                                      Nf4Tables tables, float mean, std::int64_t first_block, std::int64_t bytes,
                                      void* __restrict__ out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = first_block + i / 32;
    const float absmax = __fadd_rn(__fmul_rn(tables.absmax_map[absmax_codes[b]], scales[b / 256]), mean);
    const std::uint8_t c = codes[first_block * 32 + i];
    const float hi = __fmul_rn(tables.levels[c >> 4], absmax), lo = __fmul_rn(tables.levels[c & 15], absmax);
    if constexpr (Bf16) {
      auto* o = static_cast<__nv_bfloat16*>(out);
      o[2 * i] = __float2bfloat16_rn(hi);
      o[2 * i + 1] = __float2bfloat16_rn(lo);
    } else {
      auto* o = static_cast<float*>(out);
      o[2 * i] = hi;
      o[2 * i + 1] = lo;
    }
  }
}

}  // namespace

cudaError_t launch_nf4_dequantize(const std::uint8_t* codes, const std::uint8_t* absmax_codes, const float* scales,
                                  const Nf4Tables& tables, float mean, std::int64_t first_block, std::int64_t blocks,
                                  void* out, bool bf16, cudaStream_t stream) {
  if (blocks <= 0) return cudaSuccess;
  const std::int64_t bytes = blocks * 32;
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>((bytes + kThreads - 1) / kThreads, 65535));
  if (bf16) {
    nf4_dequantize_kernel<true><<<grid, kThreads, 0, stream>>>(codes, absmax_codes, scales, tables, mean, first_block,
                                                              bytes, out);
  } else {
    nf4_dequantize_kernel<false><<<grid, kThreads, 0, stream>>>(codes, absmax_codes, scales, tables, mean, first_block,
                                                               bytes, out);
  }
  return cudaGetLastError();
}

}  // namespace memtrain::cuda
