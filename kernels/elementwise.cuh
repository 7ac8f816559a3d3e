// Launchers for the elementwise kernels in elementwise.cu: fill, add, mul on contiguous buffers.
// Plain C++-callable (the host backend includes this with the C++ compiler). Every launcher takes raw
// device pointers, an element count and a stream, enqueues its kernel (nothing when n == 0) and
// returns cudaGetLastError(), so a bad launch is reported at the call that made it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// dst[0, n) = value. Fill is chosen by element size: the caller passes the value's bit pattern, so one
// kernel serves every dtype of that size (f64/i64, f32/i32, f16/bf16, u8/i8/bool/f8).
cudaError_t launch_fill_u8(std::uint8_t* dst, std::uint8_t value, std::size_t n, cudaStream_t stream);
cudaError_t launch_fill_u16(std::uint16_t* dst, std::uint16_t value, std::size_t n, cudaStream_t stream);
cudaError_t launch_fill_u32(std::uint32_t* dst, std::uint32_t value, std::size_t n, cudaStream_t stream);
cudaError_t launch_fill_u64(std::uint64_t* dst, std::uint64_t value, std::size_t n, cudaStream_t stream);

// out[i] = a[i] + b[i] / a[i] * b[i] for i in [0, n). f16 and bf16 are computed in f32 and rounded once
// to the output type. out may alias a or b.
cudaError_t launch_add_f32(const float* a, const float* b, float* out, std::size_t n, cudaStream_t stream);
cudaError_t launch_add_f16(const __half* a, const __half* b, __half* out, std::size_t n, cudaStream_t stream);
cudaError_t launch_add_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, std::size_t n,
                            cudaStream_t stream);
cudaError_t launch_mul_f32(const float* a, const float* b, float* out, std::size_t n, cudaStream_t stream);
cudaError_t launch_mul_f16(const __half* a, const __half* b, __half* out, std::size_t n, cudaStream_t stream);
cudaError_t launch_mul_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, std::size_t n,
                            cudaStream_t stream);

// cudaSuccess when the current device can run the kernels of this file (a kernel image or PTX for its
// architecture was compiled in); otherwise the error a launch would hit (e.g. no kernel image).
cudaError_t probe_elementwise_kernels();

}  // namespace memtrain::cuda
