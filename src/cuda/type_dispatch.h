// Compile-time element types for the host launchers of src/cuda/: calls f(Tag<T>{}) with the C++ type the
// kernels take for a dtype the entry point has already checked. Shared so every file maps dtypes alike.
#pragma once

#include "memtrain/core/dtype.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace memtrain::cuda::detail {

template <typename T>
struct Tag {
  using type = T;
};

// T = float for f32, __half for f16, __nv_bfloat16 otherwise (the launchers accept only f32, f16 and bf16).
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

// T = std::int32_t for i32, std::int64_t otherwise.
template <typename F>
void with_index_type(DType index_dtype, F&& f) {
  if (index_dtype == DType::i32) {
    f(Tag<std::int32_t>{});
  } else {
    f(Tag<std::int64_t>{});
  }
}

}  // namespace memtrain::cuda::detail
