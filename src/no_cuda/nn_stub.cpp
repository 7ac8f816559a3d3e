// The entry points of memtrain/cuda/nn.h in a build without CUDA: each throws
// "cuda::<name>: memtrain was built without CUDA" (see cuda_stub.cpp).
#include "memtrain/cuda/nn.h"

#include "memtrain/core/error.h"

namespace memtrain::cuda {

namespace {
[[noreturn]] void not_built(const char* op) { ::memtrain::detail::throw_error(op, "memtrain was built without CUDA"); }
}  // namespace

void layer_norm_forward(void*, float*, float*, const void*, const void*, const void*, DType, std::int64_t,
                        std::int64_t, double, int) {
  not_built("cuda::layer_norm_forward");
}
void layer_norm_backward(void*, void*, void*, const void*, const void*, const void*, const float*, const float*, DType,
                         std::int64_t, std::int64_t, int) {
  not_built("cuda::layer_norm_backward");
}
void rms_norm_forward(void*, float*, const void*, const void*, DType, std::int64_t, std::int64_t, double, int) {
  not_built("cuda::rms_norm_forward");
}
void rms_norm_backward(void*, void*, const void*, const void*, const void*, const float*, DType, std::int64_t,
                       std::int64_t, int) {
  not_built("cuda::rms_norm_backward");
}
void softmax_forward(void*, const void*, DType, std::int64_t, std::int64_t, int) { not_built("cuda::softmax_forward"); }
void softmax_backward(void*, const void*, const void*, DType, std::int64_t, std::int64_t, int) {
  not_built("cuda::softmax_backward");
}
void log_softmax_forward(void*, const void*, DType, std::int64_t, std::int64_t, int) {
  not_built("cuda::log_softmax_forward");
}
void log_softmax_backward(void*, const void*, const void*, DType, std::int64_t, std::int64_t, int) {
  not_built("cuda::log_softmax_backward");
}
void cross_entropy_forward(float*, float*, const void*, DType, const void*, DType, std::int64_t, std::int64_t,
                           std::int64_t, int) {
  not_built("cuda::cross_entropy_forward");
}
void cross_entropy_backward(void*, const float*, std::int64_t, const void*, const float*, DType, const void*, DType,
                            std::int64_t, std::int64_t, std::int64_t, int) {
  not_built("cuda::cross_entropy_backward");
}
void gelu_tanh_forward(void*, const void*, DType, std::size_t, int) { not_built("cuda::gelu_tanh_forward"); }
void gelu_tanh_backward(void*, const void*, const void*, DType, std::size_t, int) {
  not_built("cuda::gelu_tanh_backward");
}
void dropout_forward(void*, const void*, DType, std::size_t, double, RngState, int) {
  not_built("cuda::dropout_forward");
}
void dropout_backward(void*, const void*, DType, std::size_t, double, RngState, int) {
  not_built("cuda::dropout_backward");
}
void embedding_forward(void*, const void*, const void*, DType, DType, std::int64_t, std::int64_t, std::int64_t, int) {
  not_built("cuda::embedding_forward");
}
void embedding_backward(void*, const void*, const void*, DType, DType, std::int64_t, std::int64_t, std::int64_t,
                        int) {
  not_built("cuda::embedding_backward");
}

}  // namespace memtrain::cuda
