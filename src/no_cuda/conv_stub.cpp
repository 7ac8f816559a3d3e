// The entry points of memtrain/cuda/conv.h and memtrain/cuda/nn_spatial.h in a build without CUDA: each
// throws "cuda::<name>: memtrain was built without CUDA" (see cuda_stub.cpp).
#include "memtrain/cuda/conv.h"
#include "memtrain/cuda/nn_spatial.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

bool conv_cudnn_built() { return false; }
void conv2d_forward(void*, const void*, const void*, const void*, DType, const Conv2dShape&, int, ConvImpl) {
  not_built("cuda::conv2d_forward");
}
void conv2d_backward(void*, void*, void*, const void*, const void*, const void*, DType, const Conv2dShape&, int,
                     ConvImpl) {
  not_built("cuda::conv2d_backward");
}

void max_pool2d_forward(void*, const void*, DType, const Pool2dShape&, int) { not_built("cuda::max_pool2d_forward"); }
void max_pool2d_backward(void*, const void*, const void*, DType, const Pool2dShape&, int) {
  not_built("cuda::max_pool2d_backward");
}
void avg_pool2d_forward(void*, const void*, DType, const Pool2dShape&, int) { not_built("cuda::avg_pool2d_forward"); }
void avg_pool2d_backward(void*, const void*, DType, const Pool2dShape&, int) {
  not_built("cuda::avg_pool2d_backward");
}

void batch_norm_forward(void*, float*, float*, void*, void*, const void*, const void*, const void*, DType, std::int64_t,
                        std::int64_t, std::int64_t, bool, double, double, int) {
  not_built("cuda::batch_norm_forward");
}
void batch_norm_backward(void*, void*, void*, const void*, const void*, const void*, const float*, const float*, DType,
                         std::int64_t, std::int64_t, std::int64_t, bool, int) {
  not_built("cuda::batch_norm_backward");
}

}  // namespace memtrain::cuda
