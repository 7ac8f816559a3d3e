// Strided copy: dst[index] = src[index] over an N-d index space, each side with its own strides.
//
// Algorithm: the index space is walked in row-major order as a flat range [0, n). Each element's flat
// index is split into per-dim indices by dividing by the extents from the innermost dim outwards; the two
// element offsets are sums of index * stride in 64-bit (strided_offsets in strided_copy.cuh). When n fits
// in 32 bits the splitting uses 32-bit division (much cheaper on the GPU than 64-bit); the offsets stay
// 64-bit either way.
// Thread mapping: one thread per element with a grid-stride loop: global thread t handles flat indices
// t, t + G, t + 2G, ... (G = threads in the grid). Neighbouring threads take neighbouring innermost
// indices, so a side with unit innermost stride (the usual destination of contiguous()) is coalesced.
// The grid is capped (kMaxBlocks) and the loop covers the rest. Elements move as raw 1/2/4/8-byte words.
#include "strided_copy.cuh"

#include <algorithm>
#include <cstdint>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::uint64_t kMaxBlocks = 8192;  // ~2M threads: several waves on any current GPU

template <typename T, typename I>
__global__ void strided_copy_kernel(T* __restrict__ dst, const T* __restrict__ src, StridedCopyLayout layout,
                                    std::uint64_t n) {
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    std::int64_t dst_off, src_off;
    strided_offsets<I>(layout, static_cast<I>(i), dst_off, src_off);  // i < n, and n fits in I (see the launcher)
    dst[dst_off] = src[src_off];
  }
}

template <typename T>
cudaError_t launch_typed(void* dst, const void* src, const StridedCopyLayout& layout, std::uint64_t n,
                         cudaStream_t stream) {
  const std::uint64_t blocks = std::min<std::uint64_t>((n + kThreads - 1) / kThreads, kMaxBlocks);
  const dim3 grid(static_cast<unsigned>(blocks));
  if (n <= UINT32_MAX) {
    strided_copy_kernel<T, std::uint32_t>
        <<<grid, kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), layout, n);
  } else {
    strided_copy_kernel<T, std::uint64_t>
        <<<grid, kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), layout, n);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_strided_copy(void* dst, const void* src, const StridedCopyLayout& layout, std::size_t elem_size,
                                cudaStream_t stream) {
  if (layout.ndim < 0 || layout.ndim > kStridedCopyMaxDims) return cudaErrorInvalidValue;
  std::uint64_t n = 1;
  for (int d = 0; d < layout.ndim; ++d) {
    if (layout.shape[d] < 0) return cudaErrorInvalidValue;
    if (layout.shape[d] == 0) return cudaSuccess;
    const auto size = static_cast<std::uint64_t>(layout.shape[d]);
    if (n > UINT64_MAX / size) return cudaErrorInvalidValue;
    n *= size;
  }
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  switch (elem_size) {
    case 1:
      return launch_typed<std::uint8_t>(dst, src, layout, n, stream);
    case 2:
      return launch_typed<std::uint16_t>(dst, src, layout, n, stream);
    case 4:
      return launch_typed<std::uint32_t>(dst, src, layout, n, stream);
    case 8:
      return launch_typed<std::uint64_t>(dst, src, layout, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace memtrain::cuda
