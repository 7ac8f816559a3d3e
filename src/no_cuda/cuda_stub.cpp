// The CUDA entry points in a build without CUDA: nothing is available, and every operation throws
// "cuda::<name>: memtrain was built without CUDA". No memory source is registered, so
// Allocator::get(Device::cuda(i)) reports that no CUDA memory exists.
#include "memtrain/cuda/cuda.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
constexpr const char* kReason = "memtrain was built without CUDA";
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, kReason); }
}  // namespace

bool built_with_cuda() { return false; }
bool is_available() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return kReason; }

void copy(void*, Device, const void*, Device, std::size_t) { not_built("cuda::copy"); }
void synchronize(int) { not_built("cuda::synchronize"); }
void fill(void*, DType, std::size_t, double, int) { not_built("cuda::fill"); }
void add(const void*, const void*, void*, DType, std::size_t, int) { not_built("cuda::add"); }
void mul(const void*, const void*, void*, DType, std::size_t, int) { not_built("cuda::mul"); }
void gemm(DType, bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const void*, std::int64_t, const void*,
          std::int64_t, float, void*, std::int64_t, int) {
  not_built("cuda::gemm");
}

}  // namespace memtrain::cuda
