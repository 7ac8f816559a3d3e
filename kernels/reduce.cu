// Reductions: amax, sum, and row-wise sum over the last dimension.
//
// amax: grid-stride max of the |x| bit patterns (integer order is numeric order for non-negative floats;
// NaN patterns lie above Inf), then warp shuffles, shared memory, and one atomicMax per block into the
// output (zeroed first on the stream). Max is order-independent, so the result is deterministic.
// sum: deterministic by construction. Pass 1 runs a grid whose size depends only on n; thread t adds
// elements t, t + G, t + 2G, ... (G = threads in the grid) in f64, the block adds its threads' values by a
// fixed butterfly per warp and then warp 0..7 in order, and writes one f64 partial per block. Pass 2, one
// block, adds the partials the same way and rounds once to f32. f64 accumulation keeps the error far
// below one f32 ulp of the sum of |x| for any n we can hold.
// sum_rows: one warp per row (cols < kBlockPerRowCols) or one block per row, f64 accumulation, fixed
// trees, so every run gives the same bits. Rows are grid-strided with 64-bit indices.
#include "convert.cuh"
#include "device_math.cuh"

#include <algorithm>
#include <cstdint>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr std::size_t kMaxBlocks = 8192;
constexpr std::int64_t kBlockPerRowCols = 4096;  // at and above this many columns, a block per row

unsigned grid_for(std::size_t work, std::size_t per_block, std::size_t max_blocks) {
  const std::size_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, max_blocks));
}

template <FloatFormat From>
__device__ inline float load_f32(const cvt::StorageT<From>* src, std::size_t i) {
  return cvt::float_of(cvt::widen_to_f32<From>(src[i]));
}

__device__ inline std::uint32_t warp_max(std::uint32_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

using device::warp_sum;
// Sum over the block (blockDim.x == kThreads), valid in thread 0 (device_math.cuh).
__device__ inline double block_sum(double v, double* shared) { return device::block_sum_to_thread0<kWarps>(v, shared); }

__device__ inline float to_f32_rn(double v) {
  return cvt::float_of(cvt::f64_to_f32(static_cast<std::uint64_t>(__double_as_longlong(v))));
}

template <FloatFormat From>
__global__ void amax_kernel(const cvt::StorageT<From>* __restrict__ src, std::size_t n,
                            std::uint32_t* __restrict__ out_bits) {
  __shared__ std::uint32_t shared[kWarps];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::uint32_t local = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    local = max(local, cvt::widen_to_f32<From>(src[i]) & 0x7fffffffu);
  }
  local = warp_max(local);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x / 32] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t m = 0;
    for (int w = 0; w < kWarps; ++w) m = max(m, shared[w]);
    if (m != 0) atomicMax(out_bits, m);
  }
}

template <FloatFormat From>
__global__ void sum_partials_kernel(const cvt::StorageT<From>* __restrict__ src, std::size_t n,
                                    double* __restrict__ partials) {
  __shared__ double shared[kWarps];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    acc += static_cast<double>(load_f32<From>(src, i));
  }
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_final_kernel(const double* __restrict__ partials, unsigned count, float* __restrict__ out) {
  __shared__ double shared[kWarps];
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = to_f32_rn(total);
}

// One warp per row; the loop bound depends only on the warp index, so all lanes shuffle together.
template <FloatFormat From>
__global__ void sum_rows_warp_kernel(const cvt::StorageT<From>* __restrict__ src, std::int64_t rows,
                                     std::int64_t cols, float* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += warp_stride) {
    const std::size_t base = static_cast<std::size_t>(r * cols);
    double acc = 0.0;
    for (std::int64_t c = lane; c < cols; c += 32) acc += static_cast<double>(load_f32<From>(src, base + c));
    acc = warp_sum(acc);
    if (lane == 0) out[r] = to_f32_rn(acc);
  }
}

// One block per row; the loop bound depends only on blockIdx, so all threads reach the barriers.
template <FloatFormat From>
__global__ void sum_rows_block_kernel(const cvt::StorageT<From>* __restrict__ src, std::int64_t rows,
                                      std::int64_t cols, float* __restrict__ out) {
  __shared__ double shared[kWarps];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::size_t base = static_cast<std::size_t>(r * cols);
    double acc = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += kThreads) {
      acc += static_cast<double>(load_f32<From>(src, base + c));
    }
    const double total = block_sum(acc, shared);
    if (threadIdx.x == 0) out[r] = to_f32_rn(total);
  }
}

template <FloatFormat From>
cudaError_t sum_typed(const void* src, std::size_t n, double* partials, float* out, cudaStream_t stream) {
  // The grid depends on n only (never on the device), so the summation order is fixed for a given n.
  const unsigned grid = grid_for(n, kThreads, kSumMaxBlocks);
  sum_partials_kernel<From><<<grid, kThreads, 0, stream>>>(static_cast<const cvt::StorageT<From>*>(src), n, partials);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  sum_final_kernel<<<1, kThreads, 0, stream>>>(partials, grid, out);
  return cudaGetLastError();
}

template <FloatFormat From>
cudaError_t sum_rows_typed(const void* src, std::int64_t rows, std::int64_t cols, float* out, cudaStream_t stream) {
  const auto* s = static_cast<const cvt::StorageT<From>*>(src);
  const auto r = static_cast<std::size_t>(rows);
  if (cols >= kBlockPerRowCols) {
    sum_rows_block_kernel<From><<<grid_for(r, 1, kMaxBlocks), kThreads, 0, stream>>>(s, rows, cols, out);
  } else {
    sum_rows_warp_kernel<From><<<grid_for(r, kWarps, kMaxBlocks), kThreads, 0, stream>>>(s, rows, cols, out);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_amax(const void* src, FloatFormat src_format, std::size_t n, float* out, cudaStream_t stream) {
  auto* bits = reinterpret_cast<std::uint32_t*>(out);
  if (cudaError_t err = cudaMemsetAsync(bits, 0, sizeof(std::uint32_t), stream); err != cudaSuccess) return err;
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n, kThreads, kMaxBlocks);
  switch (src_format) {
    case FloatFormat::f32:
      amax_kernel<FloatFormat::f32><<<grid, kThreads, 0, stream>>>(static_cast<const std::uint32_t*>(src), n, bits);
      break;
    case FloatFormat::f16:
      amax_kernel<FloatFormat::f16><<<grid, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(src), n, bits);
      break;
    case FloatFormat::bf16:
      amax_kernel<FloatFormat::bf16><<<grid, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(src), n, bits);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_sum(const void* src, FloatFormat src_format, std::size_t n, double* partials, float* out,
                       cudaStream_t stream) {
  if (n == 0) return cudaMemsetAsync(out, 0, sizeof(float), stream);
  switch (src_format) {
    case FloatFormat::f32: return sum_typed<FloatFormat::f32>(src, n, partials, out, stream);
    case FloatFormat::f16: return sum_typed<FloatFormat::f16>(src, n, partials, out, stream);
    case FloatFormat::bf16: return sum_typed<FloatFormat::bf16>(src, n, partials, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_sum_rows(const void* src, FloatFormat src_format, std::int64_t rows, std::int64_t cols, float* out,
                            cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cols <= 0) return cudaMemsetAsync(out, 0, static_cast<std::size_t>(rows) * sizeof(float), stream);
  switch (src_format) {
    case FloatFormat::f32: return sum_rows_typed<FloatFormat::f32>(src, rows, cols, out, stream);
    case FloatFormat::f16: return sum_rows_typed<FloatFormat::f16>(src, rows, cols, out, stream);
    case FloatFormat::bf16: return sum_rows_typed<FloatFormat::bf16>(src, rows, cols, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace memtrain::cuda
