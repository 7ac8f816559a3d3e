// Optimizer kernels: fused f32 steps (SGD, AdamW, Lion), 8-bit block-wise steps (AdamW8bit, Lion8bit),
// block-wise quantize / dequantize, and the non-finite gradient gate.
//
// f32 steps: one grid-stride loop; global thread t handles elements t, t + G, t + 2G, ... (G = threads in
// the grid, capped at kMaxBlocks blocks), so each warp access is coalesced. Every element reads its
// parameter, gradient and state once and writes parameter and state once.
//
// 8-bit steps and quantize: one thread block per quantization block of B = THREADS * ITEMS elements
// (THREADS = min(B, 256)); thread t holds elements off + k * THREADS + t, k < ITEMS, in registers, so
// loads and stores are coalesced. A block decodes its codes through the map (copied into shared memory),
// updates in f32 registers, reduces max(0, x) and min(0, x) of the new state (warp shuffles, then one
// shared-memory pass that every thread repeats in the same order), takes the signed scale as
// detail::block_scale, and encodes x * (1 / scale) by the CPU's bucket table (quant::encode_code: one
// shared-memory load and one integer compare, equal to detail::quantize_nearest's binary search, ties to the
// lower code). With 256 threads, each thread block stages the encoder tables (the signed map's 12 KiB, the
// unsigned map's positive half, 12 KiB; its negative half is read through __ldg) into dynamic shared
// memory once, so AdamW8bit takes 26 KiB per block and 8 blocks fit on an SM. Smaller thread blocks (block
// sizes 32..128) would lose too much occupancy to the tables and read them all through __ldg (L1-resident).
// The grid is sized to what is resident at once (SMs x occupancy, at most kMaxQuantGrid), and the remaining
// quantization blocks are taken by a block-stride loop; the loop bound is uniform per block, so
// __syncthreads inside it is safe.
//
// Rounding: every expression is written with the _rn intrinsics in the order and grouping of the CPU
// source, so nvcc cannot contract a product and a sum into a fused multiply-add the CPU did not do; AdamW's
// two explicit fmaf are __fmaf_rn. Max and min are exact in any order. The nearest-code test compares
// differences in double as quantize_nearest does (exact for floats in [-1, 1]); the table encoder's
// thresholds are those exact midpoints, checked against it when the CPU builds the table.
//
// Non-finite gate: launch_nonfinite_flag clears a device int and sets it when the gradient holds NaN or
// Inf; a step kernel given that int returns at once when it is set (the read is uniform per block, before
// any barrier), leaving parameters and state untouched.
#include "optim.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 8192;     // f32 kernels: ~2M threads, several waves on any current GPU
constexpr std::size_t kMaxQuantGrid = 16384;  // 8-bit kernels: quantization blocks in flight at once

struct Map256 {
  float v[256];
};
struct MapPair {
  Map256 first, second;
};

Map256 map_param(const float* host) {
  Map256 m;
  std::copy(host, host + 256, m.v);
  return m;
}

unsigned grid_for(std::size_t work) {
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, kMaxBlocks));
}

// kernel<<<grid_for(n), kThreads, 0, stream>>>(args...) and its launch error; nothing when n == 0.
template <typename... Params, typename... Args>
cudaError_t launch_flat(void (*kernel)(Params...), std::size_t n, cudaStream_t stream, const Args&... args) {
  if (n == 0) return cudaSuccess;
  kernel<<<grid_for(n), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

__device__ __forceinline__ bool skipped(const int* skip) { return skip != nullptr && *skip != 0; }

// std::max(acc, x) and std::min(acc, x): a NaN x leaves acc unchanged, as in the CPU reductions.
__device__ __forceinline__ float max_keep(float acc, float x) { return acc < x ? x : acc; }
__device__ __forceinline__ float min_keep(float acc, float x) { return x < acc ? x : acc; }

// detail::block_scale: the larger-magnitude of max(0, x) and min(0, x), with its sign.
__device__ __forceinline__ float block_scale(float hi, float lo) { return -lo > hi ? lo : hi; }

// An encoder whose first `staged` table entries live in this block's shared memory, the rest in global.
struct SharedEncoder {
  const std::uint32_t* table;   // shared
  const std::uint32_t* global;  // all 2 * buckets entries
  std::uint32_t staged;
  int low_bits;
  std::uint32_t buckets;
  std::uint8_t zero_code;
};

// Shared-memory words for an encoder (the launchers check the sum against kMaxTableBytes).
std::size_t staged_entries(const EncodeTableArg& e) {
  return std::min<std::size_t>(e.staged, 2 * static_cast<std::size_t>(e.buckets));
}

// Copies the staged table words from global memory into shared `dst` (coalesced); the caller syncs.
template <int THREADS>
__device__ __forceinline__ SharedEncoder stage_encoder(const EncodeTableArg& e, std::uint32_t* dst) {
  const std::uint32_t staged = min(e.staged, 2 * e.buckets);
  for (std::uint32_t i = threadIdx.x; i < staged; i += THREADS) dst[i] = __ldg(e.table + i);
  return SharedEncoder{dst, e.table, staged, e.low_bits, e.buckets, e.zero_code};
}

// quant::encode_code with the entry read from shared memory when staged (always, for values of the
// expected sign), else from global memory.
__device__ __forceinline__ std::uint8_t encode(const SharedEncoder& e, float x) {
  const quant::Bucket b = quant::bucket_of(x, e.low_bits, e.buckets);
  const std::uint32_t entry = b.index < e.staged ? e.table[b.index] : __ldg(e.global + b.index);
  return quant::code_in_bucket(b, entry);
}

__device__ __forceinline__ float sign_of(float x) { return static_cast<float>((x > 0.0f) - (x < 0.0f)); }

// ---- non-finite gate ----

__global__ void nonfinite_flag_kernel(const float* __restrict__ x, std::size_t n, int* flag) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;  // exponent all ones: Inf or NaN
  if (bad) *flag = 1;  // every writer stores the same value
}

// ---- f32 steps ----

__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf,
                           std::size_t n, SgdCoeffs c, const int* skip) {
  if (skipped(skip)) return;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float pi = p[i];
    const float d = __fadd_rn(g[i], __fmul_rn(c.weight_decay, pi));  // g + wd p
    float dir = d;
    if (c.use_momentum) {
      const float b = c.first ? d : __fadd_rn(__fmul_rn(c.momentum, buf[i]), d);  // mu buf + d
      buf[i] = b;
      dir = c.nesterov ? __fadd_rn(d, __fmul_rn(c.momentum, b)) : b;
    }
    p[i] = __fsub_rn(pi, __fmul_rn(c.lr, dir));
  }
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, std::size_t n, AdamWCoeffs c, const int* skip) {
  if (skipped(skip)) return;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float gi = g[i];
    // optim::AdamW: m = fma(g, 1-b1, m*b1); v = fma((1-b2)*g, g, v*b2); p = p*decay + nss*m / denom.
    const float mi = __fmaf_rn(gi, c.one_minus_beta1, __fmul_rn(m[i], c.beta1));
    const float vi = __fmaf_rn(__fmul_rn(c.one_minus_beta2, gi), gi, __fmul_rn(v[i], c.beta2));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
    p[i] = __fadd_rn(__fmul_rn(p[i], c.decay), __fdiv_rn(__fmul_rn(c.neg_step_size, mi), denom));
  }
}

__global__ void lion_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            std::size_t n, LionCoeffs c, const int* skip) {
  if (skipped(skip)) return;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float gi = g[i], mi = m[i];
    const float u = __fadd_rn(__fmul_rn(c.beta1, mi), __fmul_rn(c.one_minus_beta1, gi));
    p[i] = __fsub_rn(__fmul_rn(p[i], c.decay), __fmul_rn(c.lr, sign_of(u)));
    m[i] = __fadd_rn(__fmul_rn(c.beta2, mi), __fmul_rn(c.one_minus_beta2, gi));
  }
}

// ---- 8-bit block machinery ----

// Reduces hi (max) and lo (min) of K quantities over the thread block; every thread gets the result.
// The caller must __syncthreads() before s_hi / s_lo are written again.
template <int K, int THREADS>
__device__ __forceinline__ void block_range(float (&hi)[K], float (&lo)[K], float (&s_hi)[K][THREADS / 32],
                                            float (&s_lo)[K][THREADS / 32]) {
  constexpr int kWarps = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      hi[k] = max_keep(hi[k], __shfl_xor_sync(0xffffffffu, hi[k], offset));
      lo[k] = min_keep(lo[k], __shfl_xor_sync(0xffffffffu, lo[k], offset));
    }
    if (lane == 0) {
      s_hi[k][warp] = hi[k];
      s_lo[k][warp] = lo[k];
    }
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    hi[k] = s_hi[k][0];
    lo[k] = s_lo[k][0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      hi[k] = max_keep(hi[k], s_hi[k][w]);
      lo[k] = min_keep(lo[k], s_lo[k][w]);
    }
  }
}

// Codes of x[k] / scale for this thread's elements of the block at `off` (the zero code when scale == 0),
// as detail::quantize_block_reference: x * (1 / scale), both rounded.
template <int THREADS, int ITEMS>
__device__ __forceinline__ void encode_items(const float (&x)[ITEMS], float scale, const SharedEncoder& enc,
                                             std::uint8_t* __restrict__ codes, std::size_t off, std::size_t n) {
  const bool zero = scale == 0.0f;
  const float inv = zero ? 0.0f : __fdiv_rn(1.0f, scale);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const std::size_t i = off + static_cast<std::size_t>(k * THREADS) + threadIdx.x;
    if (i < n)
      codes[i] = zero ? enc.zero_code : encode(enc, __fmul_rn(x[k], inv));
  }
}

// The stored absmax: an all-zero block stores +0 (as quantize_block).
__device__ __forceinline__ float stored_scale(float scale) { return scale == 0.0f ? 0.0f : scale; }

template <int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS)
    adamw8bit_kernel(float* __restrict__ p, const float* __restrict__ g, std::uint8_t* __restrict__ m_codes,
                     float* __restrict__ m_absmax, std::uint8_t* __restrict__ v_codes, float* __restrict__ v_absmax,
                     std::size_t n, std::size_t num_blocks, const __grid_constant__ MapPair maps,
                     EncodeTableArg m_arg, EncodeTableArg v_arg, AdamW8bitCoeffs c, const int* skip) {
  if (skipped(skip)) return;  // uniform over the block, before any barrier
  __shared__ float m_map[256], v_map[256];
  __shared__ float s_hi[2][THREADS / 32], s_lo[2][THREADS / 32];
  extern __shared__ std::uint32_t s_tables[];  // m table, then v table
  for (int i = threadIdx.x; i < 256; i += THREADS) {
    m_map[i] = maps.first.v[i];
    v_map[i] = maps.second.v[i];
  }
  const SharedEncoder m_enc = stage_encoder<THREADS>(m_arg, s_tables);
  const SharedEncoder v_enc = stage_encoder<THREADS>(v_arg, s_tables + min(m_arg.staged, 2 * m_arg.buckets));
  __syncthreads();
  constexpr std::size_t kBlock = static_cast<std::size_t>(THREADS) * ITEMS;
  for (std::size_t b = blockIdx.x; b < num_blocks; b += gridDim.x) {
    const std::size_t off = b * kBlock;
    const float m_old_scale = m_absmax[b], v_old_scale = v_absmax[b];
    float m[ITEMS], v[ITEMS];
    float hi[2] = {0.0f, 0.0f}, lo[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const std::size_t i = off + static_cast<std::size_t>(k * THREADS) + threadIdx.x;
      m[k] = 0.0f;
      v[k] = 0.0f;
      if (i < n) {
        const float gi = g[i];
        // optim::AdamW8bit: decode, then m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g;
        // p = p decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps).
        const float m_prev = __fmul_rn(m_map[m_codes[i]], m_old_scale);
        const float v_prev = __fmul_rn(v_map[v_codes[i]], v_old_scale);
        const float mi = __fadd_rn(__fmul_rn(c.beta1, m_prev), __fmul_rn(c.one_minus_beta1, gi));
        const float vi = __fadd_rn(__fmul_rn(c.beta2, v_prev), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
        const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_sqrt_bc2), c.eps);
        p[i] = __fsub_rn(__fmul_rn(p[i], c.decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
        m[k] = mi;
        v[k] = vi;
        hi[0] = max_keep(hi[0], mi);
        lo[0] = min_keep(lo[0], mi);
        hi[1] = max_keep(hi[1], vi);
        lo[1] = min_keep(lo[1], vi);
      }
    }
    block_range<2, THREADS>(hi, lo, s_hi, s_lo);
    const float m_scale = block_scale(hi[0], lo[0]), v_scale = block_scale(hi[1], lo[1]);
    encode_items<THREADS, ITEMS>(m, m_scale, m_enc, m_codes, off, n);
    encode_items<THREADS, ITEMS>(v, v_scale, v_enc, v_codes, off, n);
    if (threadIdx.x == 0) {
      m_absmax[b] = stored_scale(m_scale);
      v_absmax[b] = stored_scale(v_scale);
    }
    __syncthreads();  // s_hi / s_lo are reused by the next block
  }
}

template <int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS)
    lion8bit_kernel(float* __restrict__ p, const float* __restrict__ g, std::uint8_t* __restrict__ m_codes,
                    float* __restrict__ m_absmax, std::size_t n, std::size_t num_blocks,
                    const __grid_constant__ Map256 map, EncodeTableArg enc_arg, LionCoeffs c, const int* skip) {
  if (skipped(skip)) return;  // uniform over the block, before any barrier
  __shared__ float m_map[256];
  __shared__ float s_hi[1][THREADS / 32], s_lo[1][THREADS / 32];
  extern __shared__ std::uint32_t s_tables[];
  for (int i = threadIdx.x; i < 256; i += THREADS) m_map[i] = map.v[i];
  const SharedEncoder enc = stage_encoder<THREADS>(enc_arg, s_tables);
  __syncthreads();
  constexpr std::size_t kBlock = static_cast<std::size_t>(THREADS) * ITEMS;
  for (std::size_t b = blockIdx.x; b < num_blocks; b += gridDim.x) {
    const std::size_t off = b * kBlock;
    const float old_scale = m_absmax[b];
    float m[ITEMS];
    float hi[1] = {0.0f}, lo[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const std::size_t i = off + static_cast<std::size_t>(k * THREADS) + threadIdx.x;
      m[k] = 0.0f;
      if (i < n) {
        const float gi = g[i];
        const float m_prev = __fmul_rn(m_map[m_codes[i]], old_scale);
        const float u = __fadd_rn(__fmul_rn(c.beta1, m_prev), __fmul_rn(c.one_minus_beta1, gi));
        p[i] = __fsub_rn(__fmul_rn(p[i], c.decay), __fmul_rn(c.lr, sign_of(u)));
        const float mi = __fadd_rn(__fmul_rn(c.beta2, m_prev), __fmul_rn(c.one_minus_beta2, gi));
        m[k] = mi;
        hi[0] = max_keep(hi[0], mi);
        lo[0] = min_keep(lo[0], mi);
      }
    }
    block_range<1, THREADS>(hi, lo, s_hi, s_lo);
    const float scale = block_scale(hi[0], lo[0]);
    encode_items<THREADS, ITEMS>(m, scale, enc, m_codes, off, n);
    if (threadIdx.x == 0) m_absmax[b] = stored_scale(scale);
    __syncthreads();
  }
}

template <int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS)
    quantize_kernel(const float* __restrict__ src, std::uint8_t* __restrict__ codes, float* __restrict__ absmax,
                    std::size_t n, std::size_t num_blocks, EncodeTableArg enc_arg) {
  __shared__ float s_hi[1][THREADS / 32], s_lo[1][THREADS / 32];
  extern __shared__ std::uint32_t s_tables[];
  const SharedEncoder enc = stage_encoder<THREADS>(enc_arg, s_tables);
  __syncthreads();
  constexpr std::size_t kBlock = static_cast<std::size_t>(THREADS) * ITEMS;
  for (std::size_t b = blockIdx.x; b < num_blocks; b += gridDim.x) {
    const std::size_t off = b * kBlock;
    float x[ITEMS];
    float hi[1] = {0.0f}, lo[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const std::size_t i = off + static_cast<std::size_t>(k * THREADS) + threadIdx.x;
      x[k] = 0.0f;
      if (i < n) {
        x[k] = src[i];
        hi[0] = max_keep(hi[0], x[k]);
        lo[0] = min_keep(lo[0], x[k]);
      }
    }
    block_range<1, THREADS>(hi, lo, s_hi, s_lo);
    const float scale = block_scale(hi[0], lo[0]);
    encode_items<THREADS, ITEMS>(x, scale, enc, codes, off, n);
    if (threadIdx.x == 0) absmax[b] = stored_scale(scale);
    __syncthreads();
  }
}

__global__ void dequantize_kernel(const std::uint8_t* __restrict__ codes, const float* __restrict__ absmax,
                                  float* __restrict__ dst, std::size_t n, int log2_block,
                                  const __grid_constant__ Map256 map) {
  __shared__ float s_map[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) s_map[i] = map.v[i];
  __syncthreads();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __fmul_rn(s_map[codes[i]], absmax[i >> log2_block]);
}

// Calls f(THREADS, ITEMS) as integral constants for a supported block size (THREADS * ITEMS == block_size).
template <typename F>
cudaError_t with_block_shape(int block_size, F&& f) {
  using std::integral_constant;
  switch (block_size) {
    case 32: return f(integral_constant<int, 32>{}, integral_constant<int, 1>{});
    case 64: return f(integral_constant<int, 64>{}, integral_constant<int, 1>{});
    case 128: return f(integral_constant<int, 128>{}, integral_constant<int, 1>{});
    case 256: return f(integral_constant<int, 256>{}, integral_constant<int, 1>{});
    case 512: return f(integral_constant<int, 256>{}, integral_constant<int, 2>{});
    case 1024: return f(integral_constant<int, 256>{}, integral_constant<int, 4>{});
    case 2048: return f(integral_constant<int, 256>{}, integral_constant<int, 8>{});
    case 4096: return f(integral_constant<int, 256>{}, integral_constant<int, 16>{});
    default: return cudaErrorInvalidValue;
  }
}

std::size_t blocks_of(std::size_t n, int block_size) {
  const auto bs = static_cast<std::size_t>(block_size);
  return n / bs + (n % bs != 0 ? 1 : 0);
}

// Blocks for an 8-bit kernel: those resident at once (each stages its tables once), at most num_blocks.
// The resident count is cached per kernel and device, packed with the shared-memory size it was computed for.
template <auto Kernel>
cudaError_t quant_grid(int threads, std::size_t smem, std::size_t num_blocks, unsigned& grid) {
  constexpr int kCachedDevices = 64;
  static std::atomic<std::uint64_t> cache[kCachedDevices] = {};
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  const auto tag = static_cast<std::uint64_t>(smem) << 32;
  std::uint64_t packed = device >= 0 && device < kCachedDevices ? cache[device].load(std::memory_order_relaxed) : 0;
  if (packed == 0 || (packed >> 32) != (tag >> 32)) {
    int sms = 0, per_sm = 0;
    if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess)
      return err;
    if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, threads, smem);
        err != cudaSuccess)
      return err;
    const auto resident = static_cast<std::uint64_t>(std::max(sms, 1)) * static_cast<std::uint64_t>(std::max(per_sm, 1));
    packed = tag | std::min<std::uint64_t>(resident, kMaxQuantGrid);
    if (device >= 0 && device < kCachedDevices) cache[device].store(packed, std::memory_order_relaxed);
  }
  grid = static_cast<unsigned>(std::min<std::uint64_t>(num_blocks, packed & 0xffffffffu));
  return cudaSuccess;
}

// Dynamic shared memory must fit the default 48 KiB per block (no opt-in attribute is set).
constexpr std::size_t kMaxTableBytes = 48 * 1024 - 4096;

// An 8-bit kernel of kT threads per block whose staged tables take table_entries words of shared memory:
// refused past kMaxTableBytes, else launched on quant_grid's grid.
template <auto Kernel, int kT, typename... Args>
cudaError_t launch_quant(std::size_t table_entries, std::size_t nb, cudaStream_t stream, const Args&... args) {
  const std::size_t smem = table_entries * sizeof(std::uint32_t);
  if (smem > kMaxTableBytes) return cudaErrorInvalidValue;
  unsigned grid = 0;
  if (cudaError_t err = quant_grid<Kernel>(kT, smem, nb, grid); err != cudaSuccess) return err;
  Kernel<<<grid, kT, smem, stream>>>(args...);
  return cudaGetLastError();
}

// The encoder as a kernel with THREADS threads uses it: nothing staged below 256 threads (see the top).
template <int THREADS>
EncodeTableArg for_threads(EncodeTableArg e) {
  if (THREADS < 256) e.staged = 0;
  return e;
}

}  // namespace

cudaError_t launch_nonfinite_flag(const float* x, std::size_t n, int* flag, cudaStream_t stream) {
  if (cudaError_t err = cudaMemsetAsync(flag, 0, sizeof(int), stream); err != cudaSuccess) return err;
  return launch_flat(nonfinite_flag_kernel, n, stream, x, n, flag);
}

cudaError_t launch_sgd_step(float* p, const float* g, float* momentum, std::size_t n, const SgdCoeffs& c,
                            const int* skip, cudaStream_t stream) {
  return launch_flat(sgd_kernel, n, stream, p, g, momentum, n, c, skip);
}

cudaError_t launch_adamw_step(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWCoeffs& c,
                              const int* skip, cudaStream_t stream) {
  return launch_flat(adamw_kernel, n, stream, p, g, m, v, n, c, skip);
}

cudaError_t launch_lion_step(float* p, const float* g, float* m, std::size_t n, const LionCoeffs& c,
                             const int* skip, cudaStream_t stream) {
  return launch_flat(lion_kernel, n, stream, p, g, m, n, c, skip);
}

cudaError_t launch_adamw8bit_step(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax,
                                  const float* m_map, const EncodeTableArg& m_enc, std::uint8_t* v_codes,
                                  float* v_absmax, const float* v_map, const EncodeTableArg& v_enc, std::size_t n,
                                  int block_size, const AdamW8bitCoeffs& c, const int* skip, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const MapPair maps{map_param(m_map), map_param(v_map)};
  const std::size_t nb = blocks_of(n, block_size);
  return with_block_shape(block_size, [&](auto threads, auto items) {
    constexpr int kT = decltype(threads)::value, kI = decltype(items)::value;
    const EncodeTableArg me = for_threads<kT>(m_enc), ve = for_threads<kT>(v_enc);
    return launch_quant<adamw8bit_kernel<kT, kI>, kT>(staged_entries(me) + staged_entries(ve), nb, stream, p, g,
                                                      m_codes, m_absmax, v_codes, v_absmax, n, nb, maps, me, ve, c,
                                                      skip);
  });
}

cudaError_t launch_lion8bit_step(float* p, const float* g, std::uint8_t* m_codes, float* m_absmax, const float* map,
                                 const EncodeTableArg& enc, std::size_t n, int block_size, const LionCoeffs& c,
                                 const int* skip, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const Map256 m = map_param(map);
  const std::size_t nb = blocks_of(n, block_size);
  return with_block_shape(block_size, [&](auto threads, auto items) {
    constexpr int kT = decltype(threads)::value, kI = decltype(items)::value;
    const EncodeTableArg e = for_threads<kT>(enc);
    return launch_quant<lion8bit_kernel<kT, kI>, kT>(staged_entries(e), nb, stream, p, g, m_codes, m_absmax, n, nb, m,
                                                     e, c, skip);
  });
}

cudaError_t launch_quantize_blockwise(const float* src, std::uint8_t* codes, float* absmax,
                                      const EncodeTableArg& enc, std::size_t n, int block_size,
                                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const std::size_t nb = blocks_of(n, block_size);
  return with_block_shape(block_size, [&](auto threads, auto items) {
    constexpr int kT = decltype(threads)::value, kI = decltype(items)::value;
    const EncodeTableArg e = for_threads<kT>(enc);
    return launch_quant<quantize_kernel<kT, kI>, kT>(staged_entries(e), nb, stream, src, codes, absmax, n, nb, e);
  });
}

cudaError_t launch_dequantize_blockwise(const std::uint8_t* codes, const float* absmax, float* dst,
                                        const float* map, std::size_t n, int block_size, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (block_size < 1 || (block_size & (block_size - 1)) != 0) return cudaErrorInvalidValue;
  int log2_block = 0;
  while ((1 << log2_block) < block_size) ++log2_block;
  dequantize_kernel<<<grid_for(n), kThreads, 0, stream>>>(codes, absmax, dst, n, log2_block, map_param(map));
  return cudaGetLastError();
}

}  // namespace memtrain::cuda
