// backend_for(): the device kind -> backend table. The CPU and meta backends always exist; the CUDA one
// only in a build with CUDA, and then only while a usable device is present.
#include "core/backend.h"

#include "memtrain/core/error.h"
#include "memtrain/cuda/cuda.h"

namespace memtrain::detail {

// Defined by each backend's folder.
const Backend& cpu_backend();   // src/cpu/cpu_backend.cpp
const Backend& meta_backend();  // src/meta/meta_backend.cpp
#ifdef MEMTRAIN_HAVE_CUDA
// nullptr when no usable device exists; `why` then says why.
const Backend* cuda_backend(std::string& why);  // src/cuda/cuda_tensor_backend.cpp
#endif

static const Backend& backend_of_kind(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return cpu_backend();
    case DeviceType::meta: return meta_backend();
    case DeviceType::cuda: {
#ifdef MEMTRAIN_HAVE_CUDA
      std::string why;
      if (const Backend* b = cuda_backend(why)) return *b;
      throw_error(device.str(), "no usable CUDA device: " + why);
#else
      throw_error(device.str(), cuda::unavailable_reason());
#endif
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

}  // namespace memtrain::detail

#ifndef MEMTRAIN_HAVE_CUDA
// The public CUDA queries (memtrain/cuda/cuda.h) in a build with no CUDA backend to ask.
namespace memtrain::cuda {

namespace {
constexpr const char* kNotBuilt = "memtrain was built without CUDA";
}  // namespace

bool built_with_cuda() { return false; }
bool is_available() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return kNotBuilt; }
void synchronize(int) { ::memtrain::detail::throw_error("cuda::synchronize", kNotBuilt); }

}  // namespace memtrain::cuda
#endif
