// Device memory for the allocator: a MemorySource over cudaMalloc/cudaFree, registered for
// DeviceType::cuda. The allocator above it does the caching and accounting.
//
// Registration happens twice, harmlessly: at static-init time (so Allocator::get(Device::cuda(i))
// works even in a program that never calls cuda::is_available()), and from the first availability
// probe (so it does not depend on static-init order). Both go through one std::call_once.
#include "memtrain/core/allocator.h"

#include "cuda/cuda_common.h"

#include <cstdint>
#include <memory>
#include <mutex>

namespace memtrain::cuda {

namespace {

class CudaMemorySource final : public MemorySource {
 public:
  explicit CudaMemorySource(int device) : device_(device) {}

  // cudaMalloc returns 256-byte aligned memory, more than the 64 bytes MemorySource promises.
  void* raw_allocate(std::size_t nbytes) override {
    constexpr const char* op = "cuda::raw_allocate";
    detail::require_device(op, device_);
    detail::DeviceGuard guard(device_, op);
    void* ptr = nullptr;
    if (cudaError_t err = cudaMalloc(&ptr, nbytes); err != cudaSuccess) {
      cudaGetLastError();  // out-of-memory is not sticky; clear it so later checks start clean
      ::memtrain::detail::throw_error(op, fmt::format("cudaMalloc of {} bytes on cuda:{} failed: {}: {}", nbytes,
                                                      device_, cudaGetErrorName(err), cudaGetErrorString(err)));
    }
    return ptr;
  }

  // The calling thread's current stream on this device: the allocator lends cached blocks only to requests
  // on the stream their segment was allocated on (stream-ordered reuse, src/core/segment_pool.h).
  std::uintptr_t stream_key() const override {
    return reinterpret_cast<std::uintptr_t>(detail::current_stream(device_));
  }

  void raw_free(void* ptr, std::size_t) override {
    if (ptr == nullptr) return;
    // cudaFree needs no current device (unified addressing) and waits for pending work on the device.
    const cudaError_t err = cudaFree(ptr);
    // At process exit the runtime may be torn down before the allocator's cache; the driver reclaims
    // the memory then, so there is nothing to report.
    if (err == cudaErrorCudartUnloading) {
      cudaGetLastError();
      return;
    }
    detail::check_cuda(err, "cuda::raw_free", "cudaFree");
  }

 private:
  int device_;
};

}  // namespace

namespace detail {
std::unique_ptr<MemorySource> make_cuda_memory_source(int device) { return std::make_unique<CudaMemorySource>(device); }
}  // namespace detail

}  // namespace memtrain::cuda
