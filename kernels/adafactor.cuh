// Launchers for the Adafactor kernels in adafactor.cu: the statistics (row and column means of g^2 + eps1 for
// a factored second moment, the elementwise one for a vector), the unscaled update u, the RMS-clipped step
// scale and the final application. Plain C++-callable: raw device pointers, sizes, a stream; each returns
// the first launch error (cudaGetLastError() after its kernels) and enqueues nothing when its size is 0.
// Every reduction is deterministic: a fixed thread-to-element mapping that depends only on the sizes and
// fixed-order tree sums in shared memory, no atomics, all in double as optim::Adafactor sums.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// Column sums are split into chunks of rows (partial sums, then an in-order sum of the chunks), so a tall
// matrix still spreads over the GPU. The chunk count depends only on `rows`.
std::int64_t adafactor_col_chunks(std::int64_t rows);
// Blocks of the first pass of the update's sum of squares (its partials live in the caller's workspace).
std::int64_t adafactor_sumsq_blocks(std::size_t n);

// Factored statistics of g [batch, rows, cols]: R [batch * rows] and C [batch * cols] updated in place to
// beta2t * old + (1 - beta2t) * mean(g^2 + eps1) along the row / column. col_partial: double
// [batch * adafactor_col_chunks(rows) * cols], scratch.
cudaError_t launch_adafactor_factored_stats(const float* g, float* R, float* C, double* col_partial,
                                            std::int64_t batch, std::int64_t rows, std::int64_t cols,
                                            double beta2t, double eps1, cudaStream_t stream);
// u = g / sqrt(R C^T / mean(R)) per batch item, rounded as the CPU does: r_mean double [batch], scratch.
cudaError_t launch_adafactor_factored_update(const float* g, const float* R, const float* C, double* r_mean,
                                             float* u, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                                             cudaStream_t stream);
// V = beta2t * V + (1 - beta2t) * (g^2 + eps1) in double, rounded to f32; u = g / sqrt(V). All [n].
cudaError_t launch_adafactor_vector_update(const float* g, float* V, float* u, std::size_t n, double beta2t,
                                           double eps1, cudaStream_t stream);
// *scale = f32(lr / max(1, RMS(u) / clip_threshold)), RMS over u [n] in double. partial: double
// [adafactor_sumsq_blocks(n)], scratch.
cudaError_t launch_adafactor_scale(const float* u, std::size_t n, double* partial, float* scale, double lr,
                                   double clip_threshold, cudaStream_t stream);
// With M (first moment, may be null): M = b1 M + (1 - b1) (u * scale), p = p * decay - M; without:
// p = p * decay - u * scale. scale: the device float launch_adafactor_scale wrote.
cudaError_t launch_adafactor_apply(float* p, const float* u, float* M, std::size_t n, const float* scale,
                                   float decay, float beta1, float one_minus_beta1, cudaStream_t stream);

}  // namespace memtrain::cuda
