// The entry points of memtrain/cuda/elementwise.h in a build without CUDA: each throws
// "cuda::<name>: memtrain was built without CUDA" (see cuda_stub.cpp).
#include "memtrain/cuda/elementwise.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

void elementwise_unary(UnaryOp, void*, const void*, const std::int64_t*, const std::int64_t*, int, DType, double, double,
                       int) {
  not_built("cuda::elementwise_unary");
}
void elementwise_binary(BinaryOp, void*, const void*, const std::int64_t*, const void*, const std::int64_t*,
                        const std::int64_t*, int, DType, double, double, int) {
  not_built("cuda::elementwise_binary");
}
void where(void*, const void*, const std::int64_t*, const void*, const std::int64_t*, const void*, const std::int64_t*,
           const std::int64_t*, int, std::size_t, int) {
  not_built("cuda::where");
}
void compare_scalar(CompareOp, void*, const void*, const std::int64_t*, const std::int64_t*, int, DType, double, int) {
  not_built("cuda::compare_scalar");
}
void eq(void*, const void*, const std::int64_t*, const void*, const std::int64_t*, const std::int64_t*, int, DType,
        int) {
  not_built("cuda::eq");
}

}  // namespace memtrain::cuda
