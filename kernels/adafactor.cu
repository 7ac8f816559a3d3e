// Adafactor kernels (the rule of optim::Adafactor, src/optim/adafactor.cpp), one step in five launches:
//   1. row statistics: one thread block per row of g (block-stride over rows); each thread sums
//      g^2 + eps1 over columns t, t + 256, ... in double, then a fixed-order shared-memory tree sum.
//   2. column statistics: thread (b, chunk, j) sums rows [chunk * rpc, (chunk + 1) * rpc) of column j in
//      double (consecutive threads read consecutive columns: coalesced) into a partial; a second kernel
//      adds the chunks of column j in chunk order and updates C.
//   3. factored update: one block per batch item sums its new R in double (tree sum) for mean(R); then
//      u[i, j] = g * f32(1 / sqrt(R_i / mean(R))) / sqrt(C_j), one element per thread (grid-stride).
//      Vectors: V and u elementwise.
//   4. scale: a fixed grid (a function of n only) of grid-stride partial sums of u^2 in double, then one
//      block sums the partials in a fixed tree and writes the f32 step scale lr / max(1, RMS / clip).
//   5. apply: elementwise, reading the scale from device memory (no host round trip).
// Determinism: every sum has a fixed association that depends only on the sizes, no atomics. The double
// sums associate differently from the CPU's sequential loops, which moves them by ~1e-16 relative: below f32
// rounding. f32 expressions use _rn intrinsics in the CPU source's order so nvcc cannot contract them into
// fused multiply-adds; the CPU compiler (-march=native) may contract its own, an ulp of difference.
#include "adafactor.cuh"

#include <algorithm>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;                   // every kernel; the tree sums assume a power of two
constexpr std::int64_t kMaxBlocks = 8192;       // grid-stride kernels: several waves on any current GPU
constexpr std::int64_t kMinRowsPerChunk = 64;   // column partials: at least this many rows each
constexpr std::int64_t kMaxChunks = 64;
constexpr std::int64_t kSumsqBlocks = 1024;     // upper bound of the first pass of the sum of squares

unsigned grid_for(std::int64_t work) {
  const std::int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, kMaxBlocks));
}

// Sum of v over the block in a fixed tree; every thread gets the result. `sh` holds kThreads doubles.
// Must be reached by every thread of the block (it has barriers); ends with one so `sh` may be reused.
__device__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double total = sh[0];
  __syncthreads();
  return total;
}

// ---- 1 + 2: factored statistics ----

__global__ void row_stats_kernel(const float* __restrict__ g, float* __restrict__ R, std::int64_t total_rows,
                                 std::int64_t cols, double beta2t, double eps1) {
  __shared__ double sh[kThreads];
  // The loop bound is the same for every thread of a block, so the barriers in block_sum are safe.
  for (std::int64_t row = blockIdx.x; row < total_rows; row += gridDim.x) {
    const float* gr = g + row * cols;
    double acc = 0.0;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const double x = gr[j];
      acc += x * x + eps1;  // x * x is exact in double
    }
    const double sum = block_sum(acc, sh);
    if (threadIdx.x == 0) R[row] = static_cast<float>(beta2t * R[row] + (1.0 - beta2t) * (sum / cols));
  }
}

__global__ void col_partial_kernel(const float* __restrict__ g, double* __restrict__ partial, std::int64_t batch,
                                   std::int64_t rows, std::int64_t cols, std::int64_t chunks,
                                   std::int64_t rows_per_chunk, double eps1) {
  const std::int64_t total = batch * chunks * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const std::int64_t j = idx % cols;
    const std::int64_t chunk = (idx / cols) % chunks;
    const std::int64_t b = idx / (cols * chunks);
    const std::int64_t first = chunk * rows_per_chunk;
    const std::int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    const float* gb = g + b * rows * cols + j;
    double acc = 0.0;
    for (std::int64_t i = first; i < last; ++i) {
      const double x = gb[i * cols];
      acc += x * x + eps1;
    }
    partial[idx] = acc;  // idx == (b * chunks + chunk) * cols + j
  }
}

__global__ void col_finish_kernel(const double* __restrict__ partial, float* __restrict__ C, std::int64_t batch,
                                  std::int64_t rows, std::int64_t cols, std::int64_t chunks, double beta2t) {
  const std::int64_t total = batch * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const std::int64_t j = idx % cols;
    const std::int64_t b = idx / cols;
    double acc = 0.0;
    for (std::int64_t c = 0; c < chunks; ++c) acc += partial[(b * chunks + c) * cols + j];
    C[idx] = static_cast<float>(beta2t * C[idx] + (1.0 - beta2t) * (acc / rows));
  }
}

// ---- 3: the update u ----

__global__ void row_mean_kernel(const float* __restrict__ R, double* __restrict__ r_mean, std::int64_t batch,
                                std::int64_t rows) {
  __shared__ double sh[kThreads];
  for (std::int64_t b = blockIdx.x; b < batch; b += gridDim.x) {  // uniform per block
    double acc = 0.0;
    for (std::int64_t i = threadIdx.x; i < rows; i += kThreads) acc += static_cast<double>(R[b * rows + i]);
    const double sum = block_sum(acc, sh);
    if (threadIdx.x == 0) r_mean[b] = sum / rows;
  }
}

__global__ void factored_update_kernel(const float* __restrict__ g, const float* __restrict__ R,
                                       const float* __restrict__ C, const double* __restrict__ r_mean,
                                       float* __restrict__ u, std::int64_t rows, std::int64_t cols,
                                       std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const std::int64_t row = idx / cols;  // across the batch
    const std::int64_t j = idx % cols;
    const std::int64_t b = row / rows;
    // As the CPU: the row factor in double (R_i promoted), rounded once to f32; then (g * r) / sqrt(C_j).
    const float r_factor = static_cast<float>(1.0 / sqrt(static_cast<double>(R[row]) / r_mean[b]));
    u[idx] = __fdiv_rn(__fmul_rn(g[idx], r_factor), __fsqrt_rn(C[b * cols + j]));
  }
}

__global__ void vector_update_kernel(const float* __restrict__ g, float* __restrict__ V, float* __restrict__ u,
                                     std::int64_t n, double beta2t, double eps1) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float gi = g[i];
    const double x = gi;
    const float vi = static_cast<float>(beta2t * V[i] + (1.0 - beta2t) * (x * x + eps1));
    V[i] = vi;
    u[i] = __fdiv_rn(gi, __fsqrt_rn(vi));
  }
}

// ---- 4: the step scale ----

__global__ void sumsq_partial_kernel(const float* __restrict__ u, std::int64_t n, double* __restrict__ partial) {
  __shared__ double sh[kThreads];
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double x = u[i];
    acc += x * x;
  }
  const double sum = block_sum(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void scale_kernel(const double* __restrict__ partial, std::int64_t blocks, std::int64_t n,
                             float* __restrict__ scale, double lr, double clip_threshold) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < blocks; i += kThreads) acc += partial[i];
  const double sum = block_sum(acc, sh);
  if (threadIdx.x == 0) {
    const double rms = sqrt(sum / n);
    *scale = static_cast<float>(lr / fmax(1.0, rms / clip_threshold));
  }
}

// ---- 5: apply ----

__global__ void apply_kernel(float* __restrict__ p, const float* __restrict__ u, float* __restrict__ M,
                             std::int64_t n, const float* __restrict__ scale_ptr, float decay, float beta1,
                             float one_minus_beta1) {
  const float scale = *scale_ptr;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float step = __fmul_rn(u[i], scale);
    if (M != nullptr) {
      const float mi = __fadd_rn(__fmul_rn(beta1, M[i]), __fmul_rn(one_minus_beta1, step));
      M[i] = mi;
      p[i] = __fsub_rn(__fmul_rn(p[i], decay), mi);
    } else {
      p[i] = __fsub_rn(__fmul_rn(p[i], decay), step);
    }
  }
}

}  // namespace

std::int64_t adafactor_col_chunks(std::int64_t rows) {
  const std::int64_t rows_per_chunk = std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  return std::max<std::int64_t>(1, (rows + rows_per_chunk - 1) / rows_per_chunk);
}

std::int64_t adafactor_sumsq_blocks(std::size_t n) {
  const std::int64_t blocks = (static_cast<std::int64_t>(n) + kThreads - 1) / kThreads;
  return std::clamp<std::int64_t>(blocks, 1, kSumsqBlocks);
}

cudaError_t launch_adafactor_factored_stats(const float* g, float* R, float* C, double* col_partial,
                                            std::int64_t batch, std::int64_t rows, std::int64_t cols,
                                            double beta2t, double eps1, cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  const std::int64_t total_rows = batch * rows;
  row_stats_kernel<<<static_cast<unsigned>(std::min(total_rows, kMaxBlocks)), kThreads, 0, stream>>>(
      g, R, total_rows, cols, beta2t, eps1);
  const std::int64_t chunks = adafactor_col_chunks(rows);
  const std::int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  col_partial_kernel<<<grid_for(batch * chunks * cols), kThreads, 0, stream>>>(g, col_partial, batch, rows, cols,
                                                                               chunks, rows_per_chunk, eps1);
  col_finish_kernel<<<grid_for(batch * cols), kThreads, 0, stream>>>(col_partial, C, batch, rows, cols, chunks,
                                                                     beta2t);
  return cudaGetLastError();
}

cudaError_t launch_adafactor_factored_update(const float* g, const float* R, const float* C, double* r_mean,
                                             float* u, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                                             cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  row_mean_kernel<<<static_cast<unsigned>(std::min(batch, kMaxBlocks)), kThreads, 0, stream>>>(R, r_mean, batch,
                                                                                               rows);
  const std::int64_t n = batch * rows * cols;
  factored_update_kernel<<<grid_for(n), kThreads, 0, stream>>>(g, R, C, r_mean, u, rows, cols, n);
  return cudaGetLastError();
}

cudaError_t launch_adafactor_vector_update(const float* g, float* V, float* u, std::size_t n, double beta2t,
                                           double eps1, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto count = static_cast<std::int64_t>(n);
  vector_update_kernel<<<grid_for(count), kThreads, 0, stream>>>(g, V, u, count, beta2t, eps1);
  return cudaGetLastError();
}

cudaError_t launch_adafactor_scale(const float* u, std::size_t n, double* partial, float* scale, double lr,
                                   double clip_threshold, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const std::int64_t blocks = adafactor_sumsq_blocks(n);
  sumsq_partial_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(u, static_cast<std::int64_t>(n),
                                                                              partial);
  scale_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, static_cast<std::int64_t>(n), scale, lr, clip_threshold);
  return cudaGetLastError();
}

cudaError_t launch_adafactor_apply(float* p, const float* u, float* M, std::size_t n, const float* scale,
                                   float decay, float beta1, float one_minus_beta1, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto count = static_cast<std::int64_t>(n);
  apply_kernel<<<grid_for(count), kThreads, 0, stream>>>(p, u, M, count, scale, decay, beta1, one_minus_beta1);
  return cudaGetLastError();
}

}  // namespace memtrain::cuda
