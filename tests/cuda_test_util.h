// Device memory for the CUDA tests: a cuda:0 block from the allocator that is returned on scope exit,
// and typed copies between host vectors and device pointers.
#pragma once

#include "memtrain/core/allocator.h"
#include "cuda/device_ops.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace memtrain::test_support {

inline Allocator& device_allocator() { return Allocator::get(Device::cuda(0)); }

class DeviceBuffer {
 public:
  // At least one byte, so that a zero-element case still gets a real (distinct) pointer.
  explicit DeviceBuffer(std::size_t nbytes, MemoryCategory category = MemoryCategory::other)
      : block_(device_allocator().allocate(std::max<std::size_t>(nbytes, 1), category)) {}
  ~DeviceBuffer() { device_allocator().deallocate(block_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return block_.ptr; }
  // The buffer's bytes from byte_offset on, as T* (char* by default, which converts to void*).
  template <typename T = char>
  T* at(std::size_t byte_offset = 0) const {
    return static_cast<T*>(static_cast<void*>(static_cast<char*>(block_.ptr) + byte_offset));
  }

 private:
  Block block_;
};

template <typename T>
void upload(void* dst, const std::vector<T>& host) {
  cuda::copy(dst, Device::cuda(0), host.data(), Device::cpu(), host.size() * sizeof(T));
}

template <typename T>
std::vector<T> download(const void* src, std::size_t n) {
  std::vector<T> host(n);
  cuda::copy(host.data(), Device::cpu(), src, Device::cuda(0), n * sizeof(T));
  return host;
}

}  // namespace memtrain::test_support
