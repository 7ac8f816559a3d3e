// Elementwise kernels: fill, add, mul over contiguous buffers.
//
// Algorithm: two grid-stride loops per kernel. When every pointer is 16-byte aligned the first loop
// moves one 16-byte Pack (16 / sizeof(T) elements) per thread per step, so loads and stores are
// 128-bit; the second loop does the remaining n % width elements one by one. With any unaligned
// pointer the launcher sets n_vec = 0 and the scalar loop does all of it.
// Thread mapping: global thread t handles packs t, t + G, t + 2G, ... (G = threads in the grid), then
// scalar elements n_vec * width + t, + G, ...; neighbouring threads touch neighbouring 16-byte chunks,
// so each warp access is coalesced. The grid is capped (kMaxBlocks) and the loops cover the rest.
// Precision: f16 and bf16 are widened to f32, combined, and rounded once (round to nearest even).
#include "elementwise.cuh"

#include "device_math.cuh"

#include <algorithm>
#include <cstdint>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 8192;  // ~2M threads: several waves on any current GPU

template <typename T>
struct alignas(16) Pack {
  static constexpr int width = 16 / sizeof(T);
  T v[width];
};

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

unsigned grid_for(std::size_t work) {
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, kMaxBlocks));
}

using device::from_f32;
using device::to_f32;

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};

template <typename T>
__global__ void fill_kernel(T* __restrict__ dst, T value, std::size_t n, std::size_t n_vec) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  Pack<T> pack;
#pragma unroll
  for (int j = 0; j < Pack<T>::width; ++j) pack.v[j] = value;
  Pack<T>* dst_vec = reinterpret_cast<Pack<T>*>(dst);
  for (std::size_t i = tid; i < n_vec; i += stride) dst_vec[i] = pack;
  for (std::size_t i = n_vec * Pack<T>::width + tid; i < n; i += stride) dst[i] = value;
}

// No __restrict__: out may be a or b (in-place ops); each element is read before it is written by
// the same thread, so exact aliasing is safe.
template <typename T, typename Op>
__global__ void binary_kernel(const T* a, const T* b, T* out, std::size_t n, std::size_t n_vec, Op op) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Pack<T>* a_vec = reinterpret_cast<const Pack<T>*>(a);
  const Pack<T>* b_vec = reinterpret_cast<const Pack<T>*>(b);
  Pack<T>* out_vec = reinterpret_cast<Pack<T>*>(out);
  for (std::size_t i = tid; i < n_vec; i += stride) {
    const Pack<T> pa = a_vec[i];
    const Pack<T> pb = b_vec[i];
    Pack<T> po;
#pragma unroll
    for (int j = 0; j < Pack<T>::width; ++j) po.v[j] = from_f32<T>(op(to_f32(pa.v[j]), to_f32(pb.v[j])));
    out_vec[i] = po;
  }
  for (std::size_t i = n_vec * Pack<T>::width + tid; i < n; i += stride) {
    out[i] = from_f32<T>(op(to_f32(a[i]), to_f32(b[i])));
  }
}

template <typename T>
cudaError_t launch_fill(T* dst, T value, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int width = Pack<T>::width;
  const std::size_t n_vec = aligned16(dst) ? n / width : 0;
  fill_kernel<T><<<grid_for(n_vec + (n - n_vec * width)), kThreads, 0, stream>>>(dst, value, n, n_vec);
  return cudaGetLastError();
}

template <typename T, typename Op>
cudaError_t launch_binary(const T* a, const T* b, T* out, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int width = Pack<T>::width;
  const std::size_t n_vec = (aligned16(a) && aligned16(b) && aligned16(out)) ? n / width : 0;
  binary_kernel<T, Op><<<grid_for(n_vec + (n - n_vec * width)), kThreads, 0, stream>>>(a, b, out, n, n_vec, Op{});
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fill_u8(std::uint8_t* dst, std::uint8_t value, std::size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}
cudaError_t launch_fill_u16(std::uint16_t* dst, std::uint16_t value, std::size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}
cudaError_t launch_fill_u32(std::uint32_t* dst, std::uint32_t value, std::size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}
cudaError_t launch_fill_u64(std::uint64_t* dst, std::uint64_t value, std::size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}

// launch_<name>_f32 / _f16 / _bf16 (elementwise.cuh): out = a Op b.
#define MEMTRAIN_BINARY_LAUNCHERS(name, Op)                                                                     \
  cudaError_t launch_##name##_f32(const float* a, const float* b, float* out, std::size_t n, cudaStream_t stream) { \
    return launch_binary<float, Op>(a, b, out, n, stream);                                                      \
  }                                                                                                             \
  cudaError_t launch_##name##_f16(const __half* a, const __half* b, __half* out, std::size_t n,                \
                                  cudaStream_t stream) {                                                        \
    return launch_binary<__half, Op>(a, b, out, n, stream);                                                     \
  }                                                                                                             \
  cudaError_t launch_##name##_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out,         \
                                   std::size_t n, cudaStream_t stream) {                                        \
    return launch_binary<__nv_bfloat16, Op>(a, b, out, n, stream);                                              \
  }
MEMTRAIN_BINARY_LAUNCHERS(add, AddOp)
MEMTRAIN_BINARY_LAUNCHERS(mul, MulOp)
#undef MEMTRAIN_BINARY_LAUNCHERS

cudaError_t probe_elementwise_kernels() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, fill_kernel<std::uint32_t>);
}

}  // namespace memtrain::cuda
