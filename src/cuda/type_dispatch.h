// Compile-time element types for the host launchers of src/cuda/: calls f(Tag<T>{}) with the C++ type the
// kernels take for a dtype the entry point has already checked. Shared so every file maps dtypes alike.
#pragma once

#include "cuda/cuda_common.h"
#include "memtrain/core/dtype.h"
#include "memtrain/core/error.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace memtrain::cuda::detail {

template <typename T>
struct Tag {
  using type = T;
};

// The floating dtypes the launchers take: f32, and f16 / bf16 widened to f32 and rounded once on output.
inline void check_float_dtype(const char* op, DType dtype) {
  MT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op,
           "dtype {} is not supported on CUDA (f32, bf16, f16)", dtype_name(dtype));
}

// T = float for f32, __half for f16, __nv_bfloat16 otherwise (after check_float_dtype).
template <typename F>
void with_float_type(DType dtype, F&& f) {
  if (dtype == DType::f32) {
    f(Tag<float>{});
  } else if (dtype == DType::f16) {
    f(Tag<__half>{});
  } else {
    f(Tag<__nv_bfloat16>{});
  }
}

// The tail of an entry point that launches kernels typed by a float dtype (checked): requires `device`,
// makes it current and calls f(Tag<T>{}) as with_float_type does, under that device.
template <typename F>
void on_device_with_float_type(const char* op, int device, DType dtype, F&& f) {
  require_device(op, device);
  DeviceGuard guard(device, op);
  with_float_type(dtype, f);
}

// T = std::int32_t for i32, std::int64_t otherwise.
template <typename F>
void with_index_type(DType index_dtype, F&& f) {
  if (index_dtype == DType::i32) {
    f(Tag<std::int32_t>{});
  } else {
    f(Tag<std::int64_t>{});
  }
}

// f(Tag<T>{}, Tag<I>{}): with_float_type and with_index_type together, for kernels typed by both.
template <typename F>
void with_float_and_index_type(DType dtype, DType index_dtype, F&& f) {
  with_float_type(dtype, [&](auto tag) { with_index_type(index_dtype, [&](auto index_tag) { f(tag, index_tag); }); });
}
// on_device_with_float_type for kernels typed by a float and an index dtype: f(Tag<T>{}, Tag<I>{}).
template <typename F>
void on_device_with_float_and_index_type(const char* op, int device, DType dtype, DType index_dtype, F&& f) {
  require_device(op, device);
  DeviceGuard guard(device, op);
  with_float_and_index_type(dtype, index_dtype, f);
}

}  // namespace memtrain::cuda::detail
