// CUDA backend, host side of pooling and batch norm (cuda/nn_spatial.h): argument checks, then
// dispatch from DType to the launchers of kernels/spatial.cuh on the current stream (cuda/stream.h).
#include "cuda/nn_spatial.h"

#include "memtrain/core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/type_dispatch.h"
#include "kernels/spatial.cuh"

#include <cmath>
#include <cstdint>
#include <limits>

namespace memtrain::cuda {

namespace {

using detail::launch_stream;

using detail::Tag;
using detail::in;
using detail::out;

using detail::check_float_dtype;

// a * b * c fits in int64 (all >= 0).
bool product_fits(std::int64_t a, std::int64_t b, std::int64_t c) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  if (a == 0 || b == 0 || c == 0) return true;
  return a <= kMax / b && a * b <= kMax / c;
}

void check_pool(const char* op, DType dtype, const Pool2dShape& s) {
  check_float_dtype(op, dtype);
  MT_CHECK(s.planes >= 0 && s.H >= 1 && s.W >= 1, op, "bad input planes={} H={} W={}", s.planes, s.H, s.W);
  MT_CHECK(s.kernel >= 1 && s.stride >= 1 && s.padding >= 0 && 2 * s.padding <= s.kernel, op,
           "needs kernel >= 1, stride >= 1, 0 <= padding <= kernel/2, got kernel {}, stride {}, padding {}",
           s.kernel, s.stride, s.padding);
  MT_CHECK(s.H + 2 * s.padding >= s.kernel && s.W + 2 * s.padding >= s.kernel, op,
           "kernel {} does not fit input {}x{} with padding {}", s.kernel, s.H, s.W, s.padding);
  MT_CHECK(s.OH == (s.H + 2 * s.padding - s.kernel) / s.stride + 1 &&
               s.OW == (s.W + 2 * s.padding - s.kernel) / s.stride + 1,
           op, "output {}x{} does not match input {}x{}, kernel {}, stride {}, padding {}", s.OH, s.OW, s.H, s.W,
           s.kernel, s.stride, s.padding);
  MT_CHECK(product_fits(s.planes, s.H, s.W) && product_fits(s.planes, s.OH, s.OW), op,
           "planes={} x {}x{} elements overflow int64", s.planes, s.H, s.W);
}

PoolGeometry geometry(const Pool2dShape& s) {
  return {s.planes, s.H, s.W, s.kernel, s.stride, s.padding, s.OH, s.OW};
}

void check_bn(const char* op, DType dtype, std::int64_t B, std::int64_t C, std::int64_t HW) {
  check_float_dtype(op, dtype);
  MT_CHECK(B >= 0 && C >= 0 && HW >= 0, op, "negative size B={} C={} HW={}", B, C, HW);
  MT_CHECK(product_fits(B, C, HW), op, "B={} x C={} x HW={} elements overflow int64", B, C, HW);
}

// What every pooling entry point does around its launch: check, nothing for no planes, every pointer set
// (pointers_set), then launch(Tag<T>{}) on the device.
template <typename Launch>
void run_pool(const char* op, DType dtype, const Pool2dShape& s, int device, bool pointers_set, Launch&& launch) {
  check_pool(op, dtype, s);
  if (s.planes == 0) return;
  MT_CHECK(pointers_set, op, "null pointer for {} planes", s.planes);
  detail::on_device_with_float_type(op, device, dtype, launch);
}

}  // namespace

// ---- pooling ----

void max_pool2d_forward(void* y, const void* x, DType dtype, const Pool2dShape& s, int device) {
  constexpr const char* op = "cuda::max_pool2d_forward";
  run_pool(op, dtype, s, device, y != nullptr && x != nullptr, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_max_pool2d_forward<T>, out<T>(y), in<T>(x), geometry(s), launch_stream());
  });
}

void max_pool2d_backward(void* dx, const void* dout, const void* x, DType dtype, const Pool2dShape& s, int device) {
  constexpr const char* op = "cuda::max_pool2d_backward";
  run_pool(op, dtype, s, device, dx != nullptr && dout != nullptr && x != nullptr, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_max_pool2d_backward<T>, out<T>(dx), in<T>(dout), in<T>(x), geometry(s), launch_stream());
  });
}

void avg_pool2d_forward(void* y, const void* x, DType dtype, const Pool2dShape& s, int device) {
  constexpr const char* op = "cuda::avg_pool2d_forward";
  run_pool(op, dtype, s, device, y != nullptr && x != nullptr, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_avg_pool2d_forward<T>, out<T>(y), in<T>(x), geometry(s), launch_stream());
  });
}

void avg_pool2d_backward(void* dx, const void* dout, DType dtype, const Pool2dShape& s, int device) {
  constexpr const char* op = "cuda::avg_pool2d_backward";
  run_pool(op, dtype, s, device, dx != nullptr && dout != nullptr, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_avg_pool2d_backward<T>, out<T>(dx), in<T>(dout), geometry(s), launch_stream());
  });
}

// ---- batch norm ----

void batch_norm_forward(void* y, float* save_mean, float* save_invstd, void* running_mean, void* running_var,
                        const void* x, const void* weight, const void* bias, DType dtype, std::int64_t B,
                        std::int64_t C, std::int64_t HW, bool training, double momentum, double eps, int device) {
  constexpr const char* op = "cuda::batch_norm_forward";
  check_bn(op, dtype, B, C, HW);
  MT_CHECK(std::isfinite(eps) && eps >= 0.0, op, "eps={} must be finite and >= 0", eps);
  MT_CHECK((running_mean == nullptr) == (running_var == nullptr), op,
           "running_mean and running_var must both be given or both be null");
  if (training) {
    MT_CHECK(momentum >= 0.0 && momentum <= 1.0, op, "momentum={} must be in [0, 1]", momentum);
    MT_CHECK(C == 0 || B * HW >= 2, op, "training needs more than one value per channel, got B={} HW={}", B, HW);
  } else {
    MT_CHECK(running_mean != nullptr, op, "eval mode needs running_mean and running_var");
  }
  if (C == 0) return;
  MT_CHECK(save_mean != nullptr && save_invstd != nullptr && (B * HW == 0 || (y != nullptr && x != nullptr)), op,
           "null pointer for B={} C={} HW={}", B, C, HW);
  detail::on_device_with_float_type(op, device, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_batch_norm_forward<T>, out<T>(y), save_mean, save_invstd, out<T>(running_mean),
                  out<T>(running_var), in<T>(x), in<T>(weight), in<T>(bias), B, C, HW, training, momentum, eps,
                  launch_stream());
  });
}

void batch_norm_backward(void* dx, void* dweight, void* dbias, const void* dout, const void* x, const void* weight,
                         const float* save_mean, const float* save_invstd, DType dtype, std::int64_t B,
                         std::int64_t C, std::int64_t HW, bool training, int device) {
  constexpr const char* op = "cuda::batch_norm_backward";
  check_bn(op, dtype, B, C, HW);
  if (C == 0) return;
  MT_CHECK(save_mean != nullptr && save_invstd != nullptr &&
               (B * HW == 0 || (dx != nullptr && dout != nullptr && x != nullptr)),
           op, "null pointer for B={} C={} HW={}", B, C, HW);
  detail::on_device_with_float_type(op, device, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MT_CUDA_CHECK(op, launch_batch_norm_backward<T>, out<T>(dx), out<T>(dweight), out<T>(dbias), in<T>(dout),
                  in<T>(x), in<T>(weight), save_mean, save_invstd, B, C, HW, training, launch_stream());
  });
}

}  // namespace memtrain::cuda
