// Strided copies between views of CUDA device memory: the kernel behind Tensor::copy_, contiguous(),
// clone() and fill_ for CUDA tensors of any layout. Raw-pointer entry point as in cuda.h (the device's
// current stream, stream.h; a launch error throws at once; errors are memtrain::Error
// "cuda::strided_copy: ..."; argument errors throw before the device is touched). Without CUDA it throws
// "cuda::strided_copy: memtrain was built without CUDA".
#pragma once

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// For every index (i_0, ..., i_{ndim-1}) with 0 <= i_d < shape[d]:
//   dst[sum i_d * dst_strides[d]] = src[sum i_d * src_strides[d]]
// dst and src point at the element of index 0 on `device`; strides are in elements (any sign, 0 allowed:
// a stride-0 source broadcasts). elem_size: 1, 2, 4 or 8 bytes (the copy is bitwise, so one call serves
// every dtype of that size). ndim >= 0 (0: one element); any rank: dims that merge (size 1, or contiguous
// runs on both sides) are merged, the kernel walks up to 8 and the host loops over any outer rest.
// Nothing happens when an extent is 0 (pointers may then be null). Overlapping dst and src behave as a
// copy from a snapshot of src (they go through a temporary). A dst element reached by several indices
// whose source values differ (dst stride 0 over a varying source) gets one of them, unspecified which.
void strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                  const std::int64_t* shape, int ndim, std::size_t elem_size, int device);

}  // namespace memtrain::cuda
