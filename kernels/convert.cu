// Dtype conversion and FP8 scaling kernels.
//
// Algorithm: every element is converted with the integer rules of convert.cuh (cvt::), which equal the
// CPU's bit for bit. cast / quantize / dequantize are grid-stride loops over 64-bit indices; quantize
// also folds |x| into a per-thread max of the float bit patterns (for non-negative floats, integer order
// is numeric order, and every NaN pattern lies above Inf), reduced per warp by shuffles, per block in
// shared memory, and across blocks by one atomicMax per block into *amax (zeroed first on the stream).
// Max is order-independent, so amax is deterministic.
// Blockwise FP8: 1x128 tiles take one warp each (lane l holds columns l, l+32, l+64, l+96 of its tile in
// registers: amax by warp shuffles, then scale and write); 128x128 tiles take one 256-thread block each
// (thread t holds column t % 128 of rows t / 128 + 2j, j < 64, in registers; amax through shared memory).
// Thread mapping: consecutive threads touch consecutive elements (or consecutive columns of a tile
// row), so accesses are coalesced. Grids are capped and loops cover the rest, so any n fits.
#include "convert.cuh"

#include <algorithm>
#include <cstdint>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 8192;
constexpr int kTileCols = 128;

unsigned grid_for(std::size_t work, std::size_t per_block = kThreads) {
  const std::size_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, kMaxBlocks));
}

__device__ inline std::uint32_t warp_max(std::uint32_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Max of v over the block (blockDim.x == kThreads); every thread gets it. `shared` holds kThreads / 32
// values; the trailing __syncthreads lets a caller loop and call again.
__device__ inline std::uint32_t block_max(std::uint32_t v, std::uint32_t* shared) {
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  std::uint32_t m = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = max(m, shared[w]);
  __syncthreads();
  return m;
}

template <FloatFormat From, FloatFormat To>
__global__ void cast_kernel(const cvt::StorageT<From>* src, cvt::StorageT<To>* dst, std::size_t n) {
  // No __restrict__: src == dst is allowed for equal sizes (each element is read, then written, by one
  // thread).
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = cvt::convert<From, To>(src[i]);
  }
}

template <FloatFormat From, FloatFormat To>
cudaError_t cast_typed(const void* src, void* dst, std::size_t n, cudaStream_t stream) {
  using S = cvt::StorageT<From>;
  using D = cvt::StorageT<To>;
  if constexpr (From == To) {
    if (src == dst) return cudaSuccess;
    return cudaMemcpyAsync(dst, src, n * sizeof(S), cudaMemcpyDeviceToDevice, stream);
  } else {
    cast_kernel<From, To><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
    return cudaGetLastError();
  }
}

template <FloatFormat From>
cudaError_t cast_from(const void* src, void* dst, FloatFormat to, std::size_t n, cudaStream_t stream) {
  switch (to) {
    case FloatFormat::f64: return cast_typed<From, FloatFormat::f64>(src, dst, n, stream);
    case FloatFormat::f32: return cast_typed<From, FloatFormat::f32>(src, dst, n, stream);
    case FloatFormat::f16: return cast_typed<From, FloatFormat::f16>(src, dst, n, stream);
    case FloatFormat::bf16: return cast_typed<From, FloatFormat::bf16>(src, dst, n, stream);
    case FloatFormat::e4m3: return cast_typed<From, FloatFormat::e4m3>(src, dst, n, stream);
    case FloatFormat::e5m2: return cast_typed<From, FloatFormat::e5m2>(src, dst, n, stream);
  }
  return cudaErrorInvalidValue;
}

// ---- per-tensor FP8 ----

template <FloatFormat From>
__device__ inline float load_f32(const cvt::StorageT<From>* src, std::size_t i) {
  return cvt::float_of(cvt::widen_to_f32<From>(src[i]));
}

template <FloatFormat From, bool kE4M3>
__global__ void quantize_fp8_kernel(const cvt::StorageT<From>* __restrict__ src, float scale,
                                    const float* __restrict__ scale_ptr, std::uint8_t* __restrict__ dst,
                                    std::size_t n, std::uint32_t* __restrict__ amax_bits) {
  __shared__ std::uint32_t shared[kThreads / 32];
  const float s = scale_ptr != nullptr ? *scale_ptr : scale;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::uint32_t local = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = load_f32<From>(src, i);
    local = max(local, cvt::bits_of(x) & 0x7fffffffu);
    dst[i] = cvt::quantize_one(x, s, kE4M3);
  }
  if (amax_bits == nullptr) return;  // uniform over the block: no thread is left waiting at a barrier
  const std::uint32_t m = block_max(local, shared);
  if (threadIdx.x == 0 && m != 0) atomicMax(amax_bits, m);
}

template <FloatFormat To, bool kE4M3>
__global__ void dequantize_fp8_kernel(const std::uint8_t* __restrict__ src, float inv_scale,
                                      const float* __restrict__ inv_scale_ptr, cvt::StorageT<To>* __restrict__ dst,
                                      std::size_t n) {
  const float s = inv_scale_ptr != nullptr ? *inv_scale_ptr : inv_scale;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float q = cvt::float_of(kE4M3 ? cvt::e4m3_to_f32(src[i]) : cvt::e5m2_to_f32(src[i]));
    // A NaN code passes through as decoded (sign and payload kept, as on the CPU): the GPU multiply
    // would replace it by its canonical NaN.
    dst[i] = cvt::narrow_from_f32<To>(cvt::bits_of(q != q ? q : __fmul_rn(q, s)));
  }
}

// ---- blockwise FP8 ----

// One warp per 1x128 tile; tiles numbered row-major over (rows, tiles_per_row), which is also the index
// of the tile's inverse scale.
template <FloatFormat From, bool kE4M3>
__global__ void quantize_fp8_1x128_kernel(const cvt::StorageT<From>* __restrict__ src, std::uint8_t* __restrict__ dst,
                                          float* __restrict__ inv_scales, std::int64_t rows, std::int64_t cols) {
  const std::int64_t tiles_per_row = (cols + kTileCols - 1) / kTileCols;
  const std::int64_t num_tiles = rows * tiles_per_row;
  const int lane = threadIdx.x & 31;
  const std::int64_t warps_per_block = blockDim.x / 32;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * warps_per_block;
  // The loop bound depends only on the warp index, so all 32 lanes run the same iterations (full-mask
  // shuffles are safe).
  for (std::int64_t tile = static_cast<std::int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
       tile < num_tiles; tile += warp_stride) {
    const std::int64_t r = tile / tiles_per_row;
    const std::int64_t c0 = (tile - r * tiles_per_row) * kTileCols;
    const std::int64_t width = min(static_cast<std::int64_t>(kTileCols), cols - c0);
    const std::size_t base = static_cast<std::size_t>(r * cols + c0);
    float x[kTileCols / 32];
    std::uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kTileCols / 32; ++j) {
      const int c = lane + 32 * j;
      x[j] = c < width ? load_f32<From>(src, base + c) : 0.0f;
      m = max(m, cvt::bits_of(x[j]) & 0x7fffffffu);
    }
    m = warp_max(m);
    float scale = 1.0f, inv_scale = 1.0f;
    cvt::block_scale(cvt::float_of(m), kE4M3, &scale, &inv_scale);
#pragma unroll
    for (int j = 0; j < kTileCols / 32; ++j) {
      const int c = lane + 32 * j;
      if (c < width) dst[base + c] = cvt::quantize_one(x[j], scale, kE4M3);
    }
    if (lane == 0) inv_scales[tile] = inv_scale;
  }
}

// One 256-thread block per 128x128 tile; tiles numbered row-major over the scale grid.
template <FloatFormat From, bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_128x128_kernel(const cvt::StorageT<From>* __restrict__ src, std::uint8_t* __restrict__ dst,
                                float* __restrict__ inv_scales, std::int64_t rows, std::int64_t cols) {
  constexpr int kTileRows = 128;
  constexpr int kRowsPerPass = kThreads / kTileCols;       // 2
  constexpr int kPerThread = kTileRows / kRowsPerPass;     // 64
  __shared__ std::uint32_t shared[kThreads / 32];
  const std::int64_t tiles_per_row = (cols + kTileCols - 1) / kTileCols;
  const std::int64_t num_tiles = ((rows + kTileRows - 1) / kTileRows) * tiles_per_row;
  const int c = threadIdx.x % kTileCols;
  const int r_first = threadIdx.x / kTileCols;
  // The loop bound depends only on blockIdx, so every thread of a block reaches the same barriers.
  for (std::int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const std::int64_t tr = tile / tiles_per_row;
    const std::int64_t r0 = tr * kTileRows;
    const std::int64_t c0 = (tile - tr * tiles_per_row) * kTileCols;
    const std::int64_t height = min(static_cast<std::int64_t>(kTileRows), rows - r0);
    const bool col_in = c < cols - c0;
    float x[kPerThread];
    std::uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int r = r_first + kRowsPerPass * j;
      const bool in = col_in && r < height;
      x[j] = in ? load_f32<From>(src, static_cast<std::size_t>((r0 + r) * cols + c0 + c)) : 0.0f;
      m = max(m, cvt::bits_of(x[j]) & 0x7fffffffu);
    }
    m = block_max(m, shared);
    float scale = 1.0f, inv_scale = 1.0f;
    cvt::block_scale(cvt::float_of(m), kE4M3, &scale, &inv_scale);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int r = r_first + kRowsPerPass * j;
      if (col_in && r < height) {
        dst[static_cast<std::size_t>((r0 + r) * cols + c0 + c)] = cvt::quantize_one(x[j], scale, kE4M3);
      }
    }
    if (threadIdx.x == 0) inv_scales[tile] = inv_scale;
  }
}

// Element (r, c) uses inverse scale (r / tile_rows, c / 128). Grid-stride over rows x column chunks:
// a block's threads take consecutive columns of one row.
template <FloatFormat To, bool kE4M3>
__global__ void dequantize_fp8_blockwise_kernel(const std::uint8_t* __restrict__ src,
                                                const float* __restrict__ inv_scales, cvt::StorageT<To>* __restrict__ dst,
                                                std::int64_t rows, std::int64_t cols, int tile_rows) {
  const std::int64_t chunks_per_row = (cols + kThreads - 1) / kThreads;
  const std::int64_t num_chunks = rows * chunks_per_row;
  const std::int64_t scale_cols = (cols + kTileCols - 1) / kTileCols;
  for (std::int64_t chunk = blockIdx.x; chunk < num_chunks; chunk += gridDim.x) {
    const std::int64_t r = chunk / chunks_per_row;
    const std::int64_t c = (chunk - r * chunks_per_row) * kThreads + threadIdx.x;
    if (c >= cols) continue;
    const std::size_t i = static_cast<std::size_t>(r * cols + c);
    const float s = inv_scales[(r / tile_rows) * scale_cols + c / kTileCols];
    const float q = cvt::float_of(kE4M3 ? cvt::e4m3_to_f32(src[i]) : cvt::e5m2_to_f32(src[i]));
    // A NaN code passes through as decoded (sign and payload kept, as on the CPU): the GPU multiply
    // would replace it by its canonical NaN.
    dst[i] = cvt::narrow_from_f32<To>(cvt::bits_of(q != q ? q : __fmul_rn(q, s)));
  }
}

template <bool kE4M3>
cudaError_t quantize_blockwise_typed(const void* src, FloatFormat from, std::uint8_t* dst, float* inv_scales,
                                     std::int64_t rows, std::int64_t cols, int tile_rows, cudaStream_t stream) {
  const std::int64_t tiles_per_row = (cols + kTileCols - 1) / kTileCols;
  // The tiling's kernel for an f32 or a bf16 source, on `grid` blocks.
  auto launch = [&](auto* f32_kernel, auto* bf16_kernel, unsigned grid) {
    if (from == FloatFormat::f32) {
      f32_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const std::uint32_t*>(src), dst, inv_scales, rows, cols);
    } else {
      bf16_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(src), dst, inv_scales, rows, cols);
    }
    return cudaGetLastError();
  };
  if (tile_rows == 1) {
    return launch(quantize_fp8_1x128_kernel<FloatFormat::f32, kE4M3>,
                  quantize_fp8_1x128_kernel<FloatFormat::bf16, kE4M3>,
                  grid_for(static_cast<std::size_t>(rows * tiles_per_row), kThreads / 32));
  }
  return launch(quantize_fp8_128x128_kernel<FloatFormat::f32, kE4M3>,
                quantize_fp8_128x128_kernel<FloatFormat::bf16, kE4M3>,
                grid_for(static_cast<std::size_t>(((rows + 127) / 128) * tiles_per_row), 1));
}

}  // namespace

cudaError_t launch_cast(const void* src, FloatFormat src_format, void* dst, FloatFormat dst_format, std::size_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (src_format) {
    case FloatFormat::f64: return cast_from<FloatFormat::f64>(src, dst, dst_format, n, stream);
    case FloatFormat::f32: return cast_from<FloatFormat::f32>(src, dst, dst_format, n, stream);
    case FloatFormat::f16: return cast_from<FloatFormat::f16>(src, dst, dst_format, n, stream);
    case FloatFormat::bf16: return cast_from<FloatFormat::bf16>(src, dst, dst_format, n, stream);
    case FloatFormat::e4m3: return cast_from<FloatFormat::e4m3>(src, dst, dst_format, n, stream);
    case FloatFormat::e5m2: return cast_from<FloatFormat::e5m2>(src, dst, dst_format, n, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_quantize_fp8(const void* src, FloatFormat src_format, float scale, const float* scale_ptr,
                                std::uint8_t* dst, bool e4m3, std::size_t n, float* amax, cudaStream_t stream) {
  if (src_format != FloatFormat::f32 && src_format != FloatFormat::bf16) return cudaErrorInvalidValue;
  std::uint32_t* amax_bits = reinterpret_cast<std::uint32_t*>(amax);
  if (amax_bits != nullptr) {
    if (cudaError_t err = cudaMemsetAsync(amax_bits, 0, sizeof(std::uint32_t), stream); err != cudaSuccess) return err;
  }
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n);
  const bool f32 = src_format == FloatFormat::f32;
  const auto* s32 = static_cast<const std::uint32_t*>(src);
  const auto* s16 = static_cast<const std::uint16_t*>(src);
  if (f32 && e4m3) {
    quantize_fp8_kernel<FloatFormat::f32, true><<<grid, kThreads, 0, stream>>>(s32, scale, scale_ptr, dst, n, amax_bits);
  } else if (f32) {
    quantize_fp8_kernel<FloatFormat::f32, false><<<grid, kThreads, 0, stream>>>(s32, scale, scale_ptr, dst, n, amax_bits);
  } else if (e4m3) {
    quantize_fp8_kernel<FloatFormat::bf16, true><<<grid, kThreads, 0, stream>>>(s16, scale, scale_ptr, dst, n, amax_bits);
  } else {
    quantize_fp8_kernel<FloatFormat::bf16, false><<<grid, kThreads, 0, stream>>>(s16, scale, scale_ptr, dst, n, amax_bits);
  }
  return cudaGetLastError();
}

cudaError_t launch_dequantize_fp8(const std::uint8_t* src, bool e4m3, float inv_scale, const float* inv_scale_ptr,
                                  void* dst, FloatFormat dst_format, std::size_t n, cudaStream_t stream) {
  if (dst_format != FloatFormat::f32 && dst_format != FloatFormat::bf16) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n);
  auto* d32 = static_cast<std::uint32_t*>(dst);
  auto* d16 = static_cast<std::uint16_t*>(dst);
  const bool f32 = dst_format == FloatFormat::f32;
  if (f32 && e4m3) {
    dequantize_fp8_kernel<FloatFormat::f32, true><<<grid, kThreads, 0, stream>>>(src, inv_scale, inv_scale_ptr, d32, n);
  } else if (f32) {
    dequantize_fp8_kernel<FloatFormat::f32, false><<<grid, kThreads, 0, stream>>>(src, inv_scale, inv_scale_ptr, d32, n);
  } else if (e4m3) {
    dequantize_fp8_kernel<FloatFormat::bf16, true><<<grid, kThreads, 0, stream>>>(src, inv_scale, inv_scale_ptr, d16, n);
  } else {
    dequantize_fp8_kernel<FloatFormat::bf16, false><<<grid, kThreads, 0, stream>>>(src, inv_scale, inv_scale_ptr, d16, n);
  }
  return cudaGetLastError();
}

cudaError_t launch_quantize_fp8_blockwise(const void* src, FloatFormat src_format, std::uint8_t* dst, bool e4m3,
                                          float* inv_scales, std::int64_t rows, std::int64_t cols, int tile_rows,
                                          cudaStream_t stream) {
  if (src_format != FloatFormat::f32 && src_format != FloatFormat::bf16) return cudaErrorInvalidValue;
  if (tile_rows != 1 && tile_rows != 128) return cudaErrorInvalidValue;
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  return e4m3 ? quantize_blockwise_typed<true>(src, src_format, dst, inv_scales, rows, cols, tile_rows, stream)
              : quantize_blockwise_typed<false>(src, src_format, dst, inv_scales, rows, cols, tile_rows, stream);
}

cudaError_t launch_dequantize_fp8_blockwise(const std::uint8_t* src, bool e4m3, const float* inv_scales, void* dst,
                                            FloatFormat dst_format, std::int64_t rows, std::int64_t cols,
                                            int tile_rows, cudaStream_t stream) {
  if (dst_format != FloatFormat::f32 && dst_format != FloatFormat::bf16) return cudaErrorInvalidValue;
  if (tile_rows != 1 && tile_rows != 128) return cudaErrorInvalidValue;
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const std::size_t chunks = static_cast<std::size_t>(rows * ((cols + kThreads - 1) / kThreads));
  const unsigned grid = grid_for(chunks, 1);
  auto* d32 = static_cast<std::uint32_t*>(dst);
  auto* d16 = static_cast<std::uint16_t*>(dst);
  const bool f32 = dst_format == FloatFormat::f32;
  if (f32 && e4m3) {
    dequantize_fp8_blockwise_kernel<FloatFormat::f32, true>
        <<<grid, kThreads, 0, stream>>>(src, inv_scales, d32, rows, cols, tile_rows);
  } else if (f32) {
    dequantize_fp8_blockwise_kernel<FloatFormat::f32, false>
        <<<grid, kThreads, 0, stream>>>(src, inv_scales, d32, rows, cols, tile_rows);
  } else if (e4m3) {
    dequantize_fp8_blockwise_kernel<FloatFormat::bf16, true>
        <<<grid, kThreads, 0, stream>>>(src, inv_scales, d16, rows, cols, tile_rows);
  } else {
    dequantize_fp8_blockwise_kernel<FloatFormat::bf16, false>
        <<<grid, kThreads, 0, stream>>>(src, inv_scales, d16, rows, cols, tile_rows);
  }
  return cudaGetLastError();
}

}  // namespace memtrain::cuda
