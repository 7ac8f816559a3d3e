// The CUDA attention entry points (memtrain/cuda/attention.h) in a build without CUDA: each throws
// "cuda::<name>: memtrain was built without CUDA", except the kernel setting, which is only a value.
#include "memtrain/cuda/attention.h"

#include "memtrain/core/error.h"

#include <atomic>

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
std::atomic<AttentionKernels> g_kernels{AttentionKernels::automatic};
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

void set_attention_kernels(AttentionKernels kernels) { g_kernels.store(kernels, std::memory_order_relaxed); }

AttentionKernels attention_kernels() { return g_kernels.load(std::memory_order_relaxed); }

bool attention_uses_tensor_cores(DType, std::int64_t, int) { not_built("cuda::attention_uses_tensor_cores"); }

}  // namespace memtrain::cuda
