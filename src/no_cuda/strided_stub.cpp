// The entry point of memtrain/cuda/strided.h in a build without CUDA: it throws
// "cuda::strided_copy: memtrain was built without CUDA".
#include "memtrain/cuda/strided.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

void strided_copy(void*, const std::int64_t*, const void*, const std::int64_t*, const std::int64_t*, int, std::size_t,
                  int) {
  ::memtrain::detail::throw_error("cuda::strided_copy", "memtrain was built without CUDA");
}

}  // namespace memtrain::cuda
