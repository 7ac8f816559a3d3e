// The CUDA backend's basic raw entry points: copies, fills, elementwise add/mul and the cuBLAS GEMM on device
// pointers. Private to the backend (and the CUDA-vs-CPU tests); the rest of memtrain reaches them through
// tensors (src/core/backend.h).
//
// Ordering: kernels and library calls are enqueued on the calling thread's current stream of the device
// (cuda/stream.h: a cuda::StreamGuard selects one), so memtrain's work on a stream runs in call order and a
// launch returns before the kernel finishes. memtrain's streams are blocking streams, ordered with the legacy
// default stream: copy() to the host and synchronize() wait for everything enqueued before them on any of
// them. A launch error throws at once; an error inside a running kernel surfaces at the next call that waits.
// Errors: every failing CUDA/cuBLAS call becomes a memtrain::Error "cuda::<name>: <function> failed:
// <CUDA error>". These throw when no usable device exists.
#pragma once

#include "memtrain/core/device.h"
#include "memtrain/core/dtype.h"
#include "memtrain/cuda/cuda.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace memtrain::cuda {

// The module's own answers to the public queries of memtrain/cuda/cuda.h, which libmemtrain.so forwards here
// once it has loaded this module (core/cuda_module.h). Code inside the backend calls these, never the public
// ones, so nothing here depends on the loader.
namespace detail {
int usable_device_count();    // devices that can run the compiled kernels; 0 when none
std::string unusable_reason();  // why none is usable ("" when one is)
void synchronize_device(int device);  // cuda::synchronize
}  // namespace detail

// Copies nbytes between any two devices (host<->device, device<->device, host<->host). Returns when
// the source may be reused; a copy to the host has then also landed. The buffers must not overlap.
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t nbytes);

// Elementwise kernels on contiguous device buffers of n elements. dtype: f32, f16 or bf16 (fill: any).
// fill converts `value` like cpu::write_from_double (round to nearest even, integers clamp). add/mul
// compute f16/bf16 in f32 and round once; out may be a or b.
void fill(void* dst, DType dtype, std::size_t n, double value, int device);
void add(const void* a, const void* b, void* out, DType dtype, std::size_t n, int device);
void mul(const void* a, const void* b, void* out, DType dtype, std::size_t n, int device);

// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C through cuBLAS (f32, bf16 or f16 inputs with
// f32 accumulation; C has the dtype of A and B). lda/ldb/ldc are row strides in elements of the
// matrices as stored (A is [k,m] when trans_a). beta == 0: C is not read (it may hold NaN).
void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c, std::int64_t ldc,
          int device);

}  // namespace memtrain::cuda
