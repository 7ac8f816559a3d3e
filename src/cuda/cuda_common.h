// Shared by the CUDA host files (src/cuda/): turning CUDA/cuBLAS status codes into memtrain::Error,
// a scoped current-device switch, and the check every entry point makes before touching a device.
#pragma once

#include "memtrain/core/error.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace memtrain::cuda::detail {

// Throws Error("<where>: <fn> failed: <name>: <description>") unless err is cudaSuccess. Clears the
// runtime's last-error slot first, so a later launch check does not report this error again.
void check_cuda(cudaError_t err, const char* where, const char* fn);
void check_cublas(cublasStatus_t status, const char* where, const char* fn);

// Throws unless a usable device with this index exists; the message names `where` and, when no device
// is usable, unavailable_reason().
void require_device(const char* where, int device);

// Registers the CUDA MemorySource with the allocator (idempotent; see cuda_memory.cpp).
void ensure_memory_source_registered();

// Makes `device` current for the scope and restores the previous device after it.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* where);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

}  // namespace memtrain::cuda::detail

// MT_CUDA_CHECK("cuda::copy", cudaMemcpy, dst, src, n, kind): calls fn(args...) and throws an Error
// naming `where`, the function and the CUDA error when it fails.
#define MT_CUDA_CHECK(where, fn, ...) ::memtrain::cuda::detail::check_cuda(fn(__VA_ARGS__), (where), #fn)
#define MT_CUBLAS_CHECK(where, fn, ...) ::memtrain::cuda::detail::check_cublas(fn(__VA_ARGS__), (where), #fn)
