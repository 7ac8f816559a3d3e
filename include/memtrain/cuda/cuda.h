// What a user asks about CUDA: was memtrain built with it, and is a device usable. Every CUDA operation is
// reached through tensors on Device::cuda(i) (the backend contract, src/core/backend.h); the backend's raw
// entry points are private (src/cuda/).
//
// The queries never throw. In a build without CUDA there is no CUDA backend: built_with_cuda() is false, no
// device is available, and a tensor on Device::cuda(i) is refused with "memtrain was built without CUDA".
#pragma once

#include <string>

namespace memtrain::cuda {

bool built_with_cuda();  // true when this build has the CUDA backend (MEMTRAIN_HAVE_CUDA)
// True when a usable device exists: cudaGetDeviceCount succeeds, finds a device, and cuda:0 can run
// the compiled kernels. Any CUDA error (no driver, driver too old, no device) means false. Probed once
// (the probe creates a context on cuda:0) and cached.
bool is_available();
int device_count();                // 0 when not available
std::string unavailable_reason();  // why is_available() is false ("" when it is true)

// Waits for all work memtrain enqueued on the device (on any of its streams): for timing. Throws when the
// device does not exist or memtrain was built without CUDA.
void synchronize(int device);

}  // namespace memtrain::cuda
