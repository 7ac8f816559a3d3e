// The CUDA attention entry points (memtrain/cuda/attention.h) in a build without CUDA: each throws
// "cuda::<name>: memtrain was built without CUDA".
#include "memtrain/cuda/attention.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

void attention_forward(void*, const HeadLayout&, float*, const void*, const HeadLayout&, const void*, const HeadLayout&,
                       const void*, const HeadLayout&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, double,
                       bool, DType, int) {
  not_built("cuda::attention_forward");
}

void attention_backward(void*, const HeadLayout&, void*, const HeadLayout&, void*, const HeadLayout&, const void*,
                        const HeadLayout&, const void*, const HeadLayout&, const void*, const HeadLayout&, const void*,
                        const HeadLayout&, const void*, const HeadLayout&, const float*, std::int64_t, std::int64_t,
                        std::int64_t, std::int64_t, double, bool, DType, int) {
  not_built("cuda::attention_backward");
}

}  // namespace memtrain::cuda
