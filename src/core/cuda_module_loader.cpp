// Loads the CUDA backend module (core/cuda_module.h) and answers the public CUDA queries
// (memtrain/cuda/cuda.h) through it.
//
// Where the module is looked for, first match wins:
//   1. $MEMTRAIN_CUDA_BACKEND, a path to the module (tests, unusual layouts);
//   2. libmemtrain_cuda.so in the directory libmemtrain.so was loaded from, so a moved install prefix (or the
//      build tree) finds its own module and never one from another build;
//   3. libmemtrain_cuda.so by name, through the loader's search path (LD_LIBRARY_PATH, ld.so.cache).
#include "core/cuda_module.h"

#include "memtrain/core/error.h"
#include "memtrain/cuda/cuda.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace memtrain::detail {

namespace {

struct Loaded {
  const CudaModule* module = nullptr;
  std::string why;        // set when module is null
  void* handle = nullptr;  // the module's, for its other symbols
};

#ifdef MEMTRAIN_HAVE_CUDA
// The directory holding the library this function is compiled into ("" when the loader cannot say).
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr) return "";
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

std::string module_path() {
  if (const char* env = std::getenv("MEMTRAIN_CUDA_BACKEND"); env != nullptr && *env != '\0') return env;
  const std::string dir = own_directory();
  if (!dir.empty()) {
    const std::filesystem::path beside = std::filesystem::path(dir) / kCudaModuleFile;
    std::error_code ec;
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return kCudaModuleFile;
}

Loaded load() {
  const std::string path = module_path();
  // RTLD_LOCAL: the module's own symbols (its CUDA libraries') stay out of the program's namespace.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return {nullptr, fmt::format("the CUDA backend library {} could not be loaded ({})", path,
                                 err != nullptr ? err : "no reason given")};
  }
  using Entry = const CudaModule* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kCudaModuleSymbol));
  if (entry == nullptr) return {nullptr, fmt::format("{} has no symbol {}: not a memtrain CUDA backend", path, kCudaModuleSymbol)};
  const CudaModule* module = entry();
  if (module == nullptr || module->abi != kCudaModuleAbi) {
    return {nullptr, fmt::format("{} was built for another memtrain (module ABI {}, this library expects {})", path,
                                 module == nullptr ? -1 : module->abi, kCudaModuleAbi)};
  }
  // The handle is never closed: the backend's kernels and allocators live until the process ends.
  return {module, "", handle};
}
#else
Loaded load() { return {nullptr, "memtrain was built without CUDA"}; }
#endif

const Loaded& loaded_module() {
  static const Loaded loaded = load();  // thread-safe once
  return loaded;
}

}  // namespace

const CudaModule* cuda_module(std::string& why) {
  const Loaded& loaded = loaded_module();
  if (loaded.module == nullptr) why = loaded.why;
  return loaded.module;
}

void* cuda_module_symbol(const char* name, std::string& why) {
  const Loaded& loaded = loaded_module();
  if (loaded.module == nullptr) {
    why = loaded.why;
    return nullptr;
  }
#ifdef MEMTRAIN_HAVE_CUDA
  void* symbol = dlsym(loaded.handle, name);
  if (symbol == nullptr) why = fmt::format("the CUDA backend library has no symbol {}", name);
  return symbol;
#else
  why = fmt::format("memtrain was built without CUDA (no {})", name);
  return nullptr;
#endif
}

}  // namespace memtrain::detail

namespace memtrain::cuda {

using ::memtrain::detail::cuda_module;

bool built_with_cuda() {
#ifdef MEMTRAIN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int device_count() {
  std::string why;
  const auto* module = cuda_module(why);
  return module != nullptr ? module->device_count() : 0;
}

bool is_available() { return device_count() > 0; }

std::string unavailable_reason() {
  std::string why;
  const auto* module = cuda_module(why);
  return module != nullptr ? module->unavailable_reason() : why;
}

void synchronize(int device) {
  std::string why;
  const auto* module = cuda_module(why);
  if (module == nullptr) ::memtrain::detail::throw_error("cuda::synchronize", why);
  module->synchronize(device);
}

}  // namespace memtrain::cuda
