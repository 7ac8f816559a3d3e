// The entry points of memtrain/cuda/reduce.h in a build without CUDA: each throws
// "cuda::<name>: memtrain was built without CUDA" (see cuda_stub.cpp).
#include "memtrain/cuda/reduce.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

void sum_dim(const void*, void*, DType, std::int64_t, std::int64_t, std::int64_t, int) { not_built("cuda::sum_dim"); }
void sum_of_squares(const void*, DType, std::size_t, double*, int) { not_built("cuda::sum_of_squares"); }
void max_dim(const void*, void*, std::int64_t*, DType, std::int64_t, std::int64_t, std::int64_t, int) {
  not_built("cuda::max_dim");
}

}  // namespace memtrain::cuda
