// The CUDA backend as a run-time module: libmemtrain_cuda.so, built beside libmemtrain.so when the build has
// CUDA, is loaded (dlopen) the first time anything asks for a CUDA device or about CUDA, so one installed
// package serves machines with and without the CUDA toolkit: a program that never touches CUDA never needs
// libcudart, and a machine without the module gets a reason instead of a link error.
//
// The module exports one C symbol, kCudaModuleSymbol, returning the table below. Both sides are built from
// this header in the same build, so the table is plain C++ (std::string, the Backend class); kCudaModuleAbi
// guards against a module left from another build.
#pragma once

#include <string>

namespace memtrain::detail {

class Backend;

inline constexpr int kCudaModuleAbi = 2;
inline constexpr const char* kCudaModuleSymbol = "memtrain_cuda_module";
inline constexpr const char* kCudaModuleFile = "libmemtrain_cuda.so";

struct CudaModule {
  int abi = kCudaModuleAbi;
  // The backend, or nullptr with `why` set when no device is usable.
  const Backend* (*backend)(std::string& why) = nullptr;
  int (*device_count)() = nullptr;                // usable devices; 0 when none
  std::string (*unavailable_reason)() = nullptr;  // "" when a device is usable
  void (*synchronize)(int device) = nullptr;      // throws as cuda::synchronize documents
  // The calling thread's current stream on `device` (a cudaStream_t; nullptr is the legacy default stream):
  // where work from above the backend (dist's NCCL group) orders itself against memtrain's launches.
  void* (*current_stream)(int device) = nullptr;
};

// The loaded module, or nullptr with `why` naming the file and the loader's error (or that this build has
// no CUDA). Loaded once per process; later calls return the first answer.
const CudaModule* cuda_module(std::string& why);
// Another symbol of the loaded module: a higher layer's part that needs CUDA is built into the module and
// exports its own entry (dist's NCCL group, src/dist/nccl_communicator.cpp), so nothing in the backend layer
// refers to it. nullptr with `why` when the module is not loaded or lacks the symbol.
void* cuda_module_symbol(const char* name, std::string& why);

}  // namespace memtrain::detail
