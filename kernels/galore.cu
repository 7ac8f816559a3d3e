// Transpose for GaLore's projector: the matrices are small (a basis is m x r) and transposed once per basis
// refresh, so one grid-stride loop over the destination suffices: thread t writes dst elements t, t + G, ...
// (coalesced writes, strided reads). 64-bit indices throughout.
#include "galore.cuh"

#include <algorithm>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;

__global__ void transpose_kernel(const float* __restrict__ src, std::int64_t rows, std::int64_t cols,
                                 float* __restrict__ dst) {
  const std::int64_t n = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const std::int64_t j = k / rows;  // dst row = src column
    const std::int64_t i = k % rows;  // dst column = src row
    dst[k] = src[i * cols + j];
  }
}

}  // namespace

cudaError_t launch_transpose_f32(const float* src, std::int64_t rows, std::int64_t cols, float* dst,
                                 cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const std::int64_t blocks = std::clamp<std::int64_t>((rows * cols + kThreads - 1) / kThreads, 1, kMaxBlocks);
  transpose_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, rows, cols, dst);
  return cudaGetLastError();
}

}  // namespace memtrain::cuda
