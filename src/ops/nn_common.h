// Helpers shared by the nn op front-ends (src/ops/nn_*.cpp): inputs in the kernel's dtype and layout,
// integer index checks, workspace buffers accounted to MemoryCategory::workspace, and the checks of the
// CUDA branch (operands on one device; f32/bf16 contiguous device buffers, refused with a clear message
// otherwise: the kernels take those, and packing strided operands with the device's strided copy before
// the call is still to be done).
#pragma once

#include "core/operand_checks.h"
#include "memtrain/core/allocator.h"
#include "ops/op_utils.h"

#include <omp.h>

#include <cstdint>

namespace memtrain::ops::detail {

// t without autograd history, in its compute dtype, contiguous; no copy when it already is all three.
inline Tensor compute_input(const Tensor& t) {
  Tensor c = to_compute(t.detach());
  return c.is_contiguous() ? c : c.contiguous();
}

// t converted to dtype (no copy when it already is); for results computed in f32 from bf16/f16 inputs.
inline Tensor as_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// Scratch for a kernel: freed when the returned tensor dies, counted as workspace, not activations.
inline Tensor workspace(std::int64_t elems, DType dtype) {
  CategoryGuard guard(MemoryCategory::workspace);
  return Tensor::empty({elems}, dtype);
}

inline int max_threads() { return omp_get_max_threads(); }

// Integer index tensors: i32 or i64 only. The device is checked by the op (same as the data's).
inline void check_index(const char* op, const char* what, const Tensor& t) {
  check_defined(op, t);
  MT_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, op, "{} must be i32 or i64, got {} {}", what,
           dtype_name(t.dtype()), shape_str(t.shape()));
}

// ---- the CUDA branch ----

using ::memtrain::detail::check_cuda_data;
using ::memtrain::detail::check_same_device;
using ::memtrain::detail::check_cuda_same_dtype;
using ::memtrain::detail::is_cuda_kernel_dtype;

// The index helpers live with the operand checks in core, where the backends' kernels reach them too.
using ::memtrain::detail::check_index_range;
using ::memtrain::detail::dispatch_index;

}  // namespace memtrain::ops::detail
