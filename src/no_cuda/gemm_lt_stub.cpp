// cuda::gemm_lt and cuda::time_reps_ms in a build without CUDA: they throw
// "cuda::<name>: memtrain was built without CUDA", like the entry points in cuda_stub.cpp.
#include "memtrain/cuda/gemm_lt.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

void gemm_lt(const GemmLtArgs&, const void*, const void*, void*, int) { not_built("cuda::gemm_lt"); }
std::vector<float> time_reps_ms(int, int, const std::function<void(int)>&) { not_built("cuda::time_reps_ms"); }

}  // namespace memtrain::cuda
