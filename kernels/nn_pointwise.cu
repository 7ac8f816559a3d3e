// GELU (tanh approximation), dropout and embedding, forward and backward (references: src/cpu/gelu.cpp,
// src/cpu/dropout.cpp, src/cpu/embedding.cpp).
//
// GELU, embedding forward: grid-stride loops over the flat output, one element per thread per step
// (64-bit indices; the grid is capped and the loop covers the rest). GELU uses the CPU's form
// 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)), with full-precision expf.
// Dropout: thread j handles Philox block j (elements 4j .. 4j + 3), the rule of cpu/dropout.h, with the
// CPU's own Philox4x32-10 (memtrain/core/philox.h, __host__ __device__); the tests check the mask against
// the CPU's bit for bit.
// Embedding backward, deterministic and without float atomics (a segmented sum): keys k[n] = indices[n]
// (V for an out-of-range index) and positions 0..N-1 are sorted together by CUB's stable radix sort, so
// each index's positions come out grouped and in increasing n. Then one block per sorted position: the
// block at the start of a segment (key v) walks the segment, thread t summing columns t, t + blockDim, ...
// of the dout rows in n order onto dweight[v] (f32, starting from dweight[v], rounded once): the CPU's
// order of additions, so f32 results are bit-identical to cpu::embedding_backward. Blocks not at a
// segment start return at once.
#include "nn.cuh"

#include "memtrain/core/philox.h"

#include <cub/device/device_radix_sort.cuh>

namespace memtrain::cuda {

using namespace nn_device;

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 8192;  // ~2M threads: several waves on any current GPU

unsigned flat_blocks(std::int64_t work) {
  const std::int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// ---- GELU ----

// s = sigmoid(2u) = 0.5 (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3); du = u'(x). As cpu/gelu.cpp.
__device__ __forceinline__ float gelu_half_one_plus_tanh(float x, float& du) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  const float x2 = x * x;
  const float u = k0 * (x + k1 * x2 * x);
  du = k0 * (1.0f + 3.0f * k1 * x2);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

template <typename T>
__global__ void gelu_tanh_forward_kernel(T* y, const T* x, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = to_f32(x[i]);
    float du;
    y[i] = from_f32<T>(v * gelu_half_one_plus_tanh(v, du));
  }
}

// gelu' = s + 2 x s (1 - s) u', with s = 0.5 (1 + tanh u).
template <typename T>
__global__ void gelu_tanh_backward_kernel(T* dx, const T* dy, const T* x, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = to_f32(x[i]);
    float du;
    const float s = gelu_half_one_plus_tanh(v, du);
    dx[i] = from_f32<T>(to_f32(dy[i]) * (s + 2.0f * v * s * (1.0f - s) * du));
  }
}

// ---- dropout ----

template <typename T>
__global__ void dropout_kernel(T* out, const T* in, std::int64_t n, std::uint64_t threshold, float scale,
                               std::uint64_t seed, std::uint64_t offset) {
  const std::int64_t blocks = (n + 3) / 4;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    // Counter (offset + b, 0), key seed: core/philox.h, the CPU's generator. The counter wraps like the CPU's.
    const Philox4x32 r = philox4x32_10(offset + static_cast<std::uint64_t>(b), 0, seed);
    const std::uint32_t lanes[4] = {r.v[0], r.v[1], r.v[2], r.v[3]};
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const std::int64_t i = b * 4 + lane;
      if (i < n) {
        // f32: one IEEE multiply, exactly the CPU's in[i] * scale.
        out[i] = static_cast<std::uint64_t>(lanes[lane]) >= threshold ? from_f32<T>(to_f32(in[i]) * scale)
                                                                       : from_f32<T>(0.0f);
      }
    }
  }
}

// ---- embedding ----

template <typename T, typename I>
__global__ void embedding_forward_kernel(T* out, const T* weight, const I* indices, std::int64_t N, std::int64_t V,
                                         std::int64_t C) {
  const std::int64_t total = N * C;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t n = i / C, c = i - n * C;
    const std::int64_t v = static_cast<std::int64_t>(indices[n]);
    out[i] = v >= 0 && v < V ? weight[v * C + c] : from_f32<T>(__int_as_float(0x7fc00000));  // NaN: bad index
  }
}

// keys[n] = indices[n] (V when outside [0, V)), positions[n] = n.
template <typename I>
__global__ void embedding_keys_kernel(std::uint32_t* keys, std::uint32_t* positions, const I* indices, std::int64_t N,
                                      std::int64_t V) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += stride) {
    const std::int64_t v = static_cast<std::int64_t>(indices[n]);
    keys[n] = static_cast<std::uint32_t>(v >= 0 && v < V ? v : V);
    positions[n] = static_cast<std::uint32_t>(n);
  }
}

// keys / positions sorted by key (stable). Block i owns sorted position i; only segment starts work.
template <typename T>
__global__ void embedding_segment_sum_kernel(T* dweight, const T* dout, const std::uint32_t* keys,
                                             const std::uint32_t* positions, std::int64_t N, std::int64_t V,
                                             std::int64_t C) {
  for (std::int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const std::uint32_t v = keys[i];
    if (v >= V || (i > 0 && keys[i - 1] == v)) continue;  // skipped index, or not a segment start (no barriers)
    T* dst = dweight + static_cast<std::int64_t>(v) * C;  // (C)
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = to_f32(dst[c]);
      for (std::int64_t j = i; j < N && keys[j] == v; ++j) {
        acc += to_f32(dout[static_cast<std::int64_t>(positions[j]) * C + c]);
      }
      dst[c] = from_f32<T>(acc);
    }
  }
}

// Scratch layout for the embedding backward: four arrays of N uint32 (keys and positions, in and out),
// each starting on a 256-byte boundary, then CUB's temporary storage.
struct EmbeddingScratch {
  std::size_t array_bytes = 0;  // one array, rounded up to 256
  std::size_t cub_bytes = 0;
  int end_bit = 1;  // keys are in [0, V]: sort bits [0, end_bit)
  std::size_t total() const { return 4 * array_bytes + cub_bytes; }
};

cudaError_t embedding_scratch(std::int64_t N, std::int64_t V, EmbeddingScratch* s) {
  s->array_bytes = (static_cast<std::size_t>(N) * sizeof(std::uint32_t) + 255) / 256 * 256;
  s->end_bit = 1;
  while (s->end_bit < 32 && (std::int64_t{1} << s->end_bit) <= V) ++s->end_bit;
  s->cub_bytes = 0;
  const std::uint32_t* in = nullptr;
  std::uint32_t* out = nullptr;
  return cub::DeviceRadixSort::SortPairs(nullptr, s->cub_bytes, in, out, in, out, static_cast<int>(N), 0, s->end_bit);
}

}  // namespace

template <typename T>
cudaError_t launch_gelu_tanh_forward(T* y, const T* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto m = static_cast<std::int64_t>(n);
  gelu_tanh_forward_kernel<T><<<flat_blocks(m), kThreads, 0, stream>>>(y, x, m);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_gelu_tanh_backward(T* dx, const T* dy, const T* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto m = static_cast<std::int64_t>(n);
  gelu_tanh_backward_kernel<T><<<flat_blocks(m), kThreads, 0, stream>>>(dx, dy, x, m);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dropout(T* out, const T* in, std::size_t n, std::uint64_t threshold, float scale,
                           std::uint64_t seed, std::uint64_t offset, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto m = static_cast<std::int64_t>(n);
  dropout_kernel<T><<<flat_blocks((m + 3) / 4), kThreads, 0, stream>>>(out, in, m, threshold, scale, seed, offset);
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t launch_embedding_forward(T* out, const T* weight, const I* indices, std::int64_t N, std::int64_t V,
                                     std::int64_t C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  embedding_forward_kernel<T, I><<<flat_blocks(N * C), kThreads, 0, stream>>>(out, weight, indices, N, V, C);
  return cudaGetLastError();
}

cudaError_t embedding_backward_scratch_bytes(std::int64_t N, std::int64_t V, std::size_t* bytes) {
  *bytes = 0;
  if (N <= 0) return cudaSuccess;
  EmbeddingScratch s;
  if (cudaError_t err = embedding_scratch(N, V, &s); err != cudaSuccess) return err;
  *bytes = s.total();
  return cudaSuccess;
}

template <typename T, typename I>
cudaError_t launch_embedding_backward(T* dweight, const T* dout, const I* indices, std::int64_t N, std::int64_t V,
                                      std::int64_t C, void* scratch, std::size_t scratch_bytes, cudaStream_t stream) {
  if (N <= 0 || C <= 0 || V <= 0) return cudaSuccess;
  EmbeddingScratch s;
  if (cudaError_t err = embedding_scratch(N, V, &s); err != cudaSuccess) return err;
  if (scratch == nullptr || scratch_bytes < s.total()) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base + s.array_bytes);
  auto* pos_in = reinterpret_cast<std::uint32_t*>(base + 2 * s.array_bytes);
  auto* pos_out = reinterpret_cast<std::uint32_t*>(base + 3 * s.array_bytes);
  void* cub_temp = base + 4 * s.array_bytes;

  embedding_keys_kernel<I><<<flat_blocks(N), kThreads, 0, stream>>>(keys_in, pos_in, indices, N, V);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  std::size_t cub_bytes = s.cub_bytes;
  if (cudaError_t err = cub::DeviceRadixSort::SortPairs(cub_temp, cub_bytes, keys_in, keys_out, pos_in, pos_out,
                                                        static_cast<int>(N), 0, s.end_bit, stream);
      err != cudaSuccess) {
    return err;
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  const unsigned threads = static_cast<unsigned>(C >= kThreads ? kThreads : (C + 31) / 32 * 32);
  embedding_segment_sum_kernel<T><<<nn_row_blocks(N), threads, 0, stream>>>(dweight, dout, keys_out, pos_out, N, V,
                                                                            C);
  return cudaGetLastError();
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                  \
  template cudaError_t launch_gelu_tanh_forward<T>(T*, const T*, std::size_t, cudaStream_t);                     \
  template cudaError_t launch_gelu_tanh_backward<T>(T*, const T*, const T*, std::size_t, cudaStream_t);          \
  template cudaError_t launch_dropout<T>(T*, const T*, std::size_t, std::uint64_t, float, std::uint64_t,         \
                                         std::uint64_t, cudaStream_t);
#define MEMTRAIN_INSTANTIATE_EMB(T, I)                                                                           \
  template cudaError_t launch_embedding_forward<T, I>(T*, const T*, const I*, std::int64_t, std::int64_t,        \
                                                      std::int64_t, cudaStream_t);                               \
  template cudaError_t launch_embedding_backward<T, I>(T*, const T*, const I*, std::int64_t, std::int64_t,       \
                                                       std::int64_t, void*, std::size_t, cudaStream_t);
MEMTRAIN_NN_FOR_FLOAT_TYPES(MEMTRAIN_INSTANTIATE)
MEMTRAIN_NN_FOR_FLOAT_AND_INDEX_TYPES(MEMTRAIN_INSTANTIATE_EMB)
#undef MEMTRAIN_INSTANTIATE_EMB
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cuda
