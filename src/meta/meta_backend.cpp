// The meta backend: tensors with shape, dtype and accounted storage but no data. It is the CPU backend
// with every kernel skipped (src/cpu/cpu_backend.h), so each op allocates on meta exactly the bytes it
// allocates on the CPU, and a training step on meta gives the CPU step's memory to the byte without
// computing anything (the planner's dry run).
//
// Data-dependent branches take one documented answer: a meta tensor reads as zeros. item() is 0, a copy
// from meta to the CPU writes zeros, so a loss is 0, a gradient norm is 0 (no clipping), every value is
// finite (no loss-scaler overflow). Random fills draw nothing but still reserve their Philox blocks, so
// the RNG stream after a meta step is the one after the CPU step.
#include "cpu/cpu_backend.h"

#include <atomic>
#include <cstdint>
#include <cstring>

namespace memtrain::meta {

namespace {

// Hands out distinct, aligned, never-mapped addresses: nothing is reserved, and a read through one
// would fault at once (Tensor::data_ptr() refuses meta tensors before that can happen).
class MetaMemorySource final : public MemorySource {
 public:
  void* raw_allocate(std::size_t nbytes) override {
    const std::uintptr_t step = (std::max<std::size_t>(nbytes, 1) + 63) & ~std::uintptr_t{63};
    return reinterpret_cast<void*>(next_.fetch_add(step));
  }
  void raw_free(void*, std::size_t) override {}

 private:
  // Above any user-space mapping on x86-64 and AArch64 (47/48-bit), so never a real address.
  std::atomic<std::uintptr_t> next_{std::uintptr_t{1} << 56};
};

class MetaBackend final : public cpu::CpuBackend {
 public:
  bool runs_kernels() const override { return false; }

  std::unique_ptr<MemorySource> make_memory_source(int) const override {
    return std::make_unique<MetaMemorySource>();
  }
  // Meta <-> CPU: nothing moves; a CPU destination reads zeros (the meta answer for data).
  void transfer(const Tensor& dst, const Tensor&) const override {
    if (dst.device().is_cpu()) std::memset(dst.data_ptr(), 0, dst.nbytes());
  }
  double read_scalar(const Tensor&) const override { return 0.0; }
  Device host_side() const override { return Device::meta(); }
};

}  // namespace

}  // namespace memtrain::meta

namespace memtrain::detail {

const Backend& meta_backend() {
  static const meta::MetaBackend backend;
  return backend;
}

}  // namespace memtrain::detail
