// Operand checks shared by op front-ends and the backends whose kernels limit the layouts they take.
#pragma once

#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"

namespace memtrain::detail {

// The dtypes the CUDA nn kernels take (each widens to f32 and rounds once on output).
inline bool is_cuda_kernel_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// A data operand of a CUDA nn kernel: f32, bf16 or f16, contiguous.
inline void check_cuda_data(const char* op, const char* what, const Tensor& t) {
  MT_CHECK(is_cuda_kernel_dtype(t.dtype()), op,
           "{} of dtype {} on {} is not supported yet: the CUDA kernels take f32, bf16 or f16 ({} {})", what,
           dtype_name(t.dtype()), t.device().str(), what, shape_str(t.shape()));
  MT_CHECK(t.is_contiguous(), op, "a non-contiguous {} on {} is not supported yet: {} {} has strides {}", what,
           t.device().str(), what, shape_str(t.shape()), shape_str(t.strides()));
}

// The CUDA kernels take one dtype for every data array: `t` must have the dtype of `ref`.
inline void check_cuda_same_dtype(const char* op, const char* what, const Tensor& t, const char* ref_what,
                                  const Tensor& ref) {
  MT_CHECK(t.dtype() == ref.dtype(), op,
           "{} {} {} with {} {} {} on {} is not supported yet: the CUDA kernel takes one dtype for all of them",
           what, dtype_name(t.dtype()), shape_str(t.shape()), ref_what, dtype_name(ref.dtype()),
           shape_str(ref.shape()), ref.device().str());
}

}  // namespace memtrain::detail
