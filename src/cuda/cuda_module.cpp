// The entry point of libmemtrain_cuda.so: the table libmemtrain.so looks up after loading it
// (core/cuda_module.h). Everything else of the backend is reached through the table's Backend.
#include "core/cuda_module.h"

#include "cuda/cuda_common.h"
#include "cuda/device_ops.h"

namespace memtrain::detail {
const Backend* cuda_backend(std::string& why);  // src/cuda/cuda_tensor_backend.cpp
}  // namespace memtrain::detail

extern "C" __attribute__((visibility("default"))) const memtrain::detail::CudaModule* memtrain_cuda_module() {
  namespace cuda = memtrain::cuda;
  static const memtrain::detail::CudaModule module{
      .abi = memtrain::detail::kCudaModuleAbi,
      .backend = &memtrain::detail::cuda_backend,
      .device_count = &cuda::detail::usable_device_count,
      .unavailable_reason = &cuda::detail::unusable_reason,
      .synchronize = &cuda::detail::synchronize_device,
      .current_stream = [](int device) -> void* { return cuda::detail::current_stream(device); },
  };
  return &module;
}
