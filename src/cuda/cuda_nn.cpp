// CUDA backend, host side of the neural-net kernels (cuda/nn.h): argument checks, dispatch from
// DType to the launchers in kernels/nn.cuh, and the scratch the embedding backward needs. The norms have
// their own file, entries and kernels together (norm.cu).
//
// Every entry point checks its arguments first (so a bad call throws without touching a device), then
// requires the device, makes it current and enqueues on its current stream (cuda/stream.h).
// Scratch comes from the device's Allocator (category workspace) and goes back to its cache as soon as
// the kernels are enqueued: the cache hands a block only to work enqueued later on the same stream, and
// cudaFree (empty_cache) waits for the device, so the kernels still using it are never overtaken.
#include "cuda/nn.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "cuda/device_ops.h"
#include "cuda/cuda_common.h"
#include "cuda/type_dispatch.h"
#include "kernels/nn.cuh"

#include <cmath>
#include <cstdint>
#include <limits>

namespace memtrain::cuda {

namespace {

using detail::check_float_dtype;
using detail::in;
using detail::launch_stream;
using detail::out;
using detail::Tag;
using detail::with_float_type;
using detail::with_float_and_index_type;

void check_index_dtype(const char* op, DType index_dtype) {
  MT_CHECK(index_dtype == DType::i32 || index_dtype == DType::i64, op, "index dtype {} is not supported (i32, i64)",
           dtype_name(index_dtype));
}
// rows, cols >= 0 and rows * cols fits in int64.
void check_shape(const char* op, const char* rows_name, std::int64_t rows, const char* cols_name, std::int64_t cols) {
  MT_CHECK(rows >= 0 && cols >= 0, op, "negative size {}={} {}={}", rows_name, rows, cols_name, cols);
  MT_CHECK(cols == 0 || rows <= std::numeric_limits<std::int64_t>::max() / cols, op,
           "{}={} x {}={} elements overflow int64", rows_name, rows, cols_name, cols);
}

// The dtype and size checks of embedding_forward and embedding_backward.
void check_embedding(const char* op, DType dtype, DType index_dtype, std::int64_t N, std::int64_t V, std::int64_t C) {
  check_float_dtype(op, dtype);
  check_index_dtype(op, index_dtype);
  check_shape(op, "N", N, "C", C);
  check_shape(op, "V", V, "C", C);
}

using detail::Scratch;

void softmax_forward_impl(const char* op, bool is_log, void* y, const void* x, DType dtype, std::int64_t N,
                          std::int64_t C, int device) {
  check_float_dtype(op, dtype);
  check_shape(op, "N", N, "C", C);
  if (N == 0 || C == 0) return;
  MT_CHECK(y != nullptr && x != nullptr, op, "null pointer for ({}, {}) elements", N, C);
  detail::on_device_with_float_type(op, device, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_softmax_forward, out<T>(y), in<T>(x), N, C, is_log, launch_stream());
  });
}

void softmax_backward_impl(const char* op, bool is_log, void* dx, const void* dout, const void* y, DType dtype,
                           std::int64_t N, std::int64_t C, int device) {
  check_float_dtype(op, dtype);
  check_shape(op, "N", N, "C", C);
  if (N == 0 || C == 0) return;
  MT_CHECK(dx != nullptr && dout != nullptr && y != nullptr, op, "null pointer for ({}, {}) elements", N, C);
  detail::on_device_with_float_type(op, device, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_softmax_backward, out<T>(dx), in<T>(dout), in<T>(y), N, C, is_log, launch_stream());
  });
}

void dropout_impl(const char* op, void* y, const void* x, DType dtype, std::size_t n, double p, RngState state,
                  int device) {
  check_float_dtype(op, dtype);
  MT_CHECK(p >= 0.0 && p <= 1.0, op, "p={} is outside [0, 1]", p);
  MT_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) - 3, op, "n={} is too large", n);
  if (n == 0) return;
  MT_CHECK(y != nullptr && x != nullptr, op, "null pointer for {} elements", n);
  detail::require_device(op, device);
  // The CPU rule (cpu/dropout.cpp): threshold = round(p * 2^32), scale = 1 / (1 - p) rounded to f32.
  const auto threshold = static_cast<std::uint64_t>(std::llround(p * 4294967296.0));
  const float scale = p < 1.0 ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
  detail::DeviceGuard guard(device, op);
  with_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_dropout, out<T>(y), in<T>(x), n, threshold, scale, state.seed, state.offset,
                  launch_stream());
  });
}

}  // namespace

// ---- softmax ----

void softmax_forward(void* y, const void* x, DType dtype, std::int64_t N, std::int64_t C, int device) {
  softmax_forward_impl("cuda::softmax_forward", false, y, x, dtype, N, C, device);
}
void softmax_backward(void* dx, const void* dout, const void* y, DType dtype, std::int64_t N, std::int64_t C,
                      int device) {
  softmax_backward_impl("cuda::softmax_backward", false, dx, dout, y, dtype, N, C, device);
}
void log_softmax_forward(void* y, const void* x, DType dtype, std::int64_t N, std::int64_t C, int device) {
  softmax_forward_impl("cuda::log_softmax_forward", true, y, x, dtype, N, C, device);
}
void log_softmax_backward(void* dx, const void* dout, const void* y, DType dtype, std::int64_t N, std::int64_t C,
                          int device) {
  softmax_backward_impl("cuda::log_softmax_backward", true, dx, dout, y, dtype, N, C, device);
}

// ---- cross entropy ----

void cross_entropy_forward(float* losses, float* lse, const void* logits, DType dtype, const void* targets,
                           DType index_dtype, std::int64_t N, std::int64_t V, std::int64_t ignore_index, int device) {
  constexpr const char* op = "cuda::cross_entropy_forward";
  check_float_dtype(op, dtype);
  check_index_dtype(op, index_dtype);
  check_shape(op, "N", N, "V", V);
  if (N == 0) return;
  MT_CHECK(V > 0, op, "V is 0: no classes for {} rows", N);
  MT_CHECK(losses != nullptr && logits != nullptr && targets != nullptr, op,
           "null pointer among losses, logits, targets for ({}, {}) logits", N, V);
  detail::on_device_with_float_and_index_type(op, device, dtype, index_dtype, [&](auto tag, auto index_tag) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(index_tag)::type;
    MT_CUDA_CHECK(op, launch_cross_entropy_forward, losses, lse, in<T>(logits), in<I>(targets), N, V, ignore_index,
                  launch_stream());
  });
}

void cross_entropy_backward(void* dlogits, const float* dloss, std::int64_t dloss_stride, const void* logits,
                            const float* lse, DType dtype, const void* targets, DType index_dtype, std::int64_t N,
                            std::int64_t V, std::int64_t ignore_index, int device) {
  constexpr const char* op = "cuda::cross_entropy_backward";
  check_float_dtype(op, dtype);
  check_index_dtype(op, index_dtype);
  check_shape(op, "N", N, "V", V);
  MT_CHECK(dloss_stride >= 0, op, "dloss_stride={} is negative", dloss_stride);
  MT_CHECK(N == 0 || dloss_stride <= std::numeric_limits<std::int64_t>::max() / N, op,
           "dloss_stride={} x N={} overflows int64", dloss_stride, N);
  if (N == 0 || V == 0) return;
  MT_CHECK(dlogits != nullptr && dloss != nullptr && logits != nullptr && lse != nullptr && targets != nullptr, op,
           "null pointer among dlogits, dloss, logits, lse, targets for ({}, {}) logits", N, V);
  detail::on_device_with_float_and_index_type(op, device, dtype, index_dtype, [&](auto tag, auto index_tag) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(index_tag)::type;
    MT_CUDA_CHECK(op, launch_cross_entropy_backward, out<T>(dlogits), dloss, dloss_stride, in<T>(logits), lse,
                  in<I>(targets), N, V, ignore_index, launch_stream());
  });
}

// ---- GELU ----

void gelu_tanh_forward(void* y, const void* x, DType dtype, std::size_t n, int device) {
  constexpr const char* op = "cuda::gelu_tanh_forward";
  check_float_dtype(op, dtype);
  MT_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()), op, "n={} is too large", n);
  if (n == 0) return;
  MT_CHECK(y != nullptr && x != nullptr, op, "null pointer for {} elements", n);
  detail::on_device_with_float_type(op, device, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_gelu_tanh_forward, out<T>(y), in<T>(x), n, launch_stream());
  });
}

void gelu_tanh_backward(void* dx, const void* dy, const void* x, DType dtype, std::size_t n, int device) {
  constexpr const char* op = "cuda::gelu_tanh_backward";
  check_float_dtype(op, dtype);
  MT_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()), op, "n={} is too large", n);
  if (n == 0) return;
  MT_CHECK(dx != nullptr && dy != nullptr && x != nullptr, op, "null pointer for {} elements", n);
  detail::on_device_with_float_type(op, device, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_gelu_tanh_backward, out<T>(dx), in<T>(dy), in<T>(x), n, launch_stream());
  });
}

// ---- dropout ----

void dropout_forward(void* y, const void* x, DType dtype, std::size_t n, double p, RngState state, int device) {
  dropout_impl("cuda::dropout_forward", y, x, dtype, n, p, state, device);
}
void dropout_backward(void* dx, const void* dout, DType dtype, std::size_t n, double p, RngState state, int device) {
  dropout_impl("cuda::dropout_backward", dx, dout, dtype, n, p, state, device);  // the same mask and scale
}

// ---- embedding ----

void embedding_forward(void* y, const void* weight, const void* indices, DType dtype, DType index_dtype,
                       std::int64_t N, std::int64_t V, std::int64_t C, int device) {
  constexpr const char* op = "cuda::embedding_forward";
  check_embedding(op, dtype, index_dtype, N, V, C);
  if (N == 0 || C == 0) return;
  MT_CHECK(V > 0, op, "V is 0: an empty table cannot be indexed by {} indices", N);
  MT_CHECK(y != nullptr && weight != nullptr && indices != nullptr, op,
           "null pointer among out, weight, indices for ({}, {}) elements", N, C);
  detail::on_device_with_float_and_index_type(op, device, dtype, index_dtype, [&](auto tag, auto index_tag) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(index_tag)::type;
    MT_CUDA_CHECK(op, launch_embedding_forward, out<T>(y), in<T>(weight), in<I>(indices), N, V, C, launch_stream());
  });
}

void embedding_backward(void* dweight, const void* dout, const void* indices, DType dtype, DType index_dtype,
                        std::int64_t N, std::int64_t V, std::int64_t C, int device) {
  constexpr const char* op = "cuda::embedding_backward";
  check_embedding(op, dtype, index_dtype, N, V, C);
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  MT_CHECK(N <= kMax && V <= kMax, op, "N={} or V={} exceeds 2^31 - 1", N, V);
  if (N == 0 || C == 0) return;
  MT_CHECK(V > 0, op, "V is 0: an empty table cannot be indexed by {} indices", N);
  MT_CHECK(dweight != nullptr && dout != nullptr && indices != nullptr, op,
           "null pointer among dweight, dout, indices for ({}, {}) elements", N, C);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  std::size_t bytes = 0;
  MT_CUDA_CHECK(op, embedding_backward_scratch_bytes, N, V, &bytes);
  Scratch scratch(device, bytes);
  with_float_and_index_type(dtype, index_dtype, [&](auto tag, auto index_tag) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(index_tag)::type;
    MT_CUDA_CHECK(op, launch_embedding_backward, out<T>(dweight), in<T>(dout), in<I>(indices), N, V, C,
                  scratch.get(), scratch.size(), launch_stream());
  });
}

}  // namespace memtrain::cuda
