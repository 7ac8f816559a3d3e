// Launcher for the one kernel GaLore's projector needs besides cuBLAS / cuSOLVER: an out-of-place
// transpose (row-major bases <-> column-major working matrices). Raw device pointers, sizes, a stream;
// returns cudaGetLastError() after the launch; nothing is enqueued when a size is 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace memtrain::cuda {

// dst[j * rows + i] = src[i * cols + j] for i < rows, j < cols (dst: cols x rows, row-major).
cudaError_t launch_transpose_f32(const float* src, std::int64_t rows, std::int64_t cols, float* dst,
                                 cudaStream_t stream);

}  // namespace memtrain::cuda
