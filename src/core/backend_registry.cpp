// backend_for(): the device kind -> backend table. The CPU and meta backends always exist; the CUDA one
// only when its module (libmemtrain_cuda.so, core/cuda_module.h) loads and a usable device is present.
#include "core/backend.h"
#include "core/cuda_module.h"

#include "memtrain/core/error.h"

namespace memtrain::detail {

// Defined by each backend's folder.
const Backend& cpu_backend();   // src/cpu/cpu_backend.cpp
const Backend& meta_backend();  // src/meta/meta_backend.cpp

static const Backend& backend_of_kind(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return cpu_backend();
    case DeviceType::meta: return meta_backend();
    case DeviceType::cuda: {
      // The module (core/cuda_module.h) is loaded on first use; its backend is asked only once it exists.
      std::string why;
      const CudaModule* module = cuda_module(why);
      if (module == nullptr) throw_error(device.str(), why);
      if (const Backend* b = module->backend(why)) return *b;
      throw_error(device.str(), "no usable CUDA device: " + why);
    }
  }
  throw_error(device.str(), "unknown device kind");
}

const Backend& backend_for(Device device) {
  const Backend& backend = backend_of_kind(device);
  MT_CHECK(device.index >= 0 && device.index < backend.device_count(), device.str(),
           "no such device: this machine has {} of this kind", backend.device_count());
  return backend;
}

CachePolicy cache_policy_for(Device device) {
  // cudaMalloc is slow and synchronising: a device carves blocks from segments it splits and merges. Host memory
  // is quick to get, so the CPU keeps whole blocks by size class, and so does meta, which models the CPU.
  return device.is_cuda() ? CachePolicy::segments : CachePolicy::size_classes;
}

const Backend& backend_for_transfer(Device dst, Device src) {
  if (src.is_meta() || dst.is_meta()) return meta_backend();
  return backend_for(dst.is_cpu() ? src : dst);
}

}  // namespace memtrain::detail
