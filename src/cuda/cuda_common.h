// Shared by the CUDA host files (src/cuda/): turning CUDA/cuBLAS status codes into memtrain::Error,
// a scoped current-device switch, and the check every entry point makes before touching a device.
#pragma once

#include "memtrain/core/allocator.h"
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

// The calling thread's current stream on `device` (src/cuda/stream.h): nullptr, the legacy
// default stream, unless a StreamGuard is active. Every launch and library call goes to it.
cudaStream_t current_stream(int device);
// The current stream of the current device: what entry points use under their DeviceGuard. Costs a
// cudaGetDevice only when some StreamGuard is active on this thread.
cudaStream_t current_stream();
// Sets the calling thread's current stream on `device` and returns the previous one (for StreamGuard).
cudaStream_t exchange_current_stream(int device, cudaStream_t stream);

// The device memory of `device` for its Allocator (cuda_memory.cpp).
std::unique_ptr<MemorySource> make_cuda_memory_source(int device);

// Where a host file's launches go: the current stream of the current device (include/memtrain/cuda/
// stream.h). Every entry point calls it under its DeviceGuard, so that is the entry point's device.
inline cudaStream_t launch_stream() { return current_stream(); }

// Typed views of the untyped device pointers the entry points take.
template <typename T>
const T* in(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* out(void* p) {
  return static_cast<T*>(p);
}

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

// Device bytes for one call, allocated while the call's stream is current and returned at scope exit
// (after the call's work is enqueued). Stream-ordered reuse in the allocator keeps the block from other
// streams' work until then, so a call on a non-default stream uses this instead of a buffer shared by
// every call on the device (two streams could otherwise use one buffer at the same time).
class CallScratch {
 public:
  CallScratch(int device, std::size_t bytes)
      : device_(device), block_(Allocator::get(Device::cuda(device)).allocate(bytes, MemoryCategory::workspace)) {}
  ~CallScratch() { Allocator::get(Device::cuda(device_)).deallocate(block_); }
  CallScratch(const CallScratch&) = delete;
  CallScratch& operator=(const CallScratch&) = delete;
  void* get() const { return block_.ptr; }

 private:
  int device_;
  Block block_;
};

// A block of workspace on `device` for one call, returned to the allocator's cache on scope exit. No
// allocation for 0 bytes (get() is then nullptr).
class Scratch {
 public:
  Scratch(int device, std::size_t nbytes) : allocator_(Allocator::get(Device::cuda(device))) {
    if (nbytes > 0) block_ = allocator_.allocate(nbytes, MemoryCategory::workspace);
  }
  ~Scratch() {
    if (block_.ptr != nullptr) allocator_.deallocate(block_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return block_.ptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(block_.ptr);
  }
  std::size_t size() const { return block_.nbytes; }

 private:
  Allocator& allocator_;
  Block block_;
};

}  // namespace memtrain::cuda::detail

// MT_CUDA_CHECK("cuda::copy", cudaMemcpy, dst, src, n, kind): calls fn(args...) and throws an Error
// naming `where`, the function and the CUDA error when it fails.
#define MT_CUDA_CHECK(where, fn, ...) ::memtrain::cuda::detail::check_cuda(fn(__VA_ARGS__), (where), #fn)
#define MT_CUBLAS_CHECK(where, fn, ...) ::memtrain::cuda::detail::check_cublas(fn(__VA_ARGS__), (where), #fn)
