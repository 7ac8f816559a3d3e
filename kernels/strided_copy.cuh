// Launcher for the strided-copy kernel in strided_copy.cu: dst[index] = src[index] over an N-d index space
// (N <= kStridedCopyMaxDims), each operand with its own strides, elements of 1, 2, 4 or 8 bytes.
// Plain C++-callable (the host backend includes this with the C++ compiler). The layout travels to the
// kernel by value as a kernel parameter; the launcher enqueues the kernel (nothing when an extent is 0) and
// returns cudaGetLastError(), or cudaErrorInvalidValue for an element size or rank it does not take.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

inline constexpr int kStridedCopyMaxDims = 8;

// Row-major index space shape[0, ndim); strides in elements (any sign). ndim 0 is one element.
struct StridedCopyLayout {
  int ndim = 0;
  std::int64_t shape[kStridedCopyMaxDims] = {};
  std::int64_t dst_strides[kStridedCopyMaxDims] = {};
  std::int64_t src_strides[kStridedCopyMaxDims] = {};
};

#if defined(__CUDACC__)
#define MT_STRIDED_HOST_DEVICE __host__ __device__
#else
#define MT_STRIDED_HOST_DEVICE
#endif

// The element offsets (in elements) of flat row-major index `flat` (< the layout's element count, which
// must fit in I) on each side. Host-callable, so the index math is unit-testable without a GPU. Dims
// ndim-1 .. 1 take one division each, unrolled over the fixed maximum so the layout stays in registers /
// kernel-parameter space; what is left is the index along dim 0 (0 when ndim == 0, whose strides are 0).
template <typename I>
MT_STRIDED_HOST_DEVICE inline void strided_offsets(const StridedCopyLayout& layout, I flat, std::int64_t& dst_off,
                                                   std::int64_t& src_off) {
  I rem = flat;
  dst_off = 0;
  src_off = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int d = kStridedCopyMaxDims - 1; d > 0; --d) {
    if (d < layout.ndim) {
      const I size = static_cast<I>(layout.shape[d]);
      const I q = rem / size;
      const auto idx = static_cast<std::int64_t>(rem - q * size);
      dst_off += idx * layout.dst_strides[d];
      src_off += idx * layout.src_strides[d];
      rem = q;
    }
  }
  dst_off += static_cast<std::int64_t>(rem) * layout.dst_strides[0];
  src_off += static_cast<std::int64_t>(rem) * layout.src_strides[0];
}

// dst + sum(i_d * dst_strides[d]) receives src + sum(i_d * src_strides[d]) for every index (i_0, ..., i_{ndim-1})
// with 0 <= i_d < shape[d]. dst and src are device pointers to the element at index 0. Elements of dst reached
// by more than one index receive one of their values (unspecified which); overlapping dst and src give an
// unspecified result (the host entry point routes those through a temporary).
cudaError_t launch_strided_copy(void* dst, const void* src, const StridedCopyLayout& layout, std::size_t elem_size,
                                cudaStream_t stream);

}  // namespace memtrain::cuda
