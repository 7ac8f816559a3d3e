// Operand checks shared by op front-ends and the backends whose kernels limit the layouts they take, and the
// integer index helpers of the gather/scatter kernels (embedding, cross-entropy).
#pragma once

#include "memtrain/core/error.h"
#include "memtrain/core/tensor.h"

#include <cstdint>

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

// round_into_bf16's operands (core/backend_entries.def): param contiguous bf16, value contiguous f32 and
// compensation (when defined) contiguous bf16, both of param's numel.
inline void check_round_into_bf16(const Tensor& param, const Tensor& value, const Tensor& compensation,
                                  std::uint64_t first) {
  constexpr const char* op = "round_into_bf16";
  MT_CHECK(first % 8 == 0, op, "a slice must start on a multiple of 8 elements (one Philox block), got {}", first);
  MT_CHECK(param.dtype() == DType::bf16 && param.is_contiguous(), op, "param must be contiguous bf16, got {} {}",
           dtype_name(param.dtype()), shape_str(param.shape()));
  MT_CHECK(value.dtype() == DType::f32 && value.is_contiguous() && value.numel() == param.numel() &&
               value.device() == param.device(),
           op, "value must be contiguous f32 of {} elements on {}, got {} {} on {}", param.numel(),
           param.device().str(), dtype_name(value.dtype()), shape_str(value.shape()), value.device().str());
  MT_CHECK(!compensation.defined() || (compensation.dtype() == DType::bf16 && compensation.is_contiguous() &&
                                       compensation.numel() == param.numel() && compensation.device() == param.device()),
           op, "compensation must be contiguous bf16 of {} elements on {}, got {} {}", param.numel(),
           param.device().str(), dtype_name(compensation.dtype()), shape_str(compensation.shape()));
}

// The CUDA kernels take one dtype for every data array: `t` must have the dtype of `ref`.
inline void check_cuda_same_dtype(const char* op, const char* what, const Tensor& t, const char* ref_what,
                                  const Tensor& ref) {
  MT_CHECK(t.dtype() == ref.dtype(), op,
           "{} {} {} with {} {} {} on {} is not supported yet: the CUDA kernel takes one dtype for all of them",
           what, dtype_name(t.dtype()), shape_str(t.shape()), ref_what, dtype_name(ref.dtype()),
           shape_str(ref.shape()), ref.device().str());
}

// Calls f(std::int32_t{}) or f(std::int64_t{}) for an integer index dtype (i32 or i64, checked by the caller).
template <typename F>
decltype(auto) dispatch_index(DType t, F&& f) {
  if (t == DType::i32) return f(std::int32_t{});
  return f(std::int64_t{});
}

// Throws naming the op, the offending value and its (flat) position when an index lies outside [0, n)
// and is not `ignore` (only consulted when has_ignore).
template <typename I>
void check_index_range(const char* op, const char* what, const I* idx, std::int64_t count, std::int64_t n,
                       bool has_ignore, std::int64_t ignore, const Shape& shape) {
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t v = static_cast<std::int64_t>(idx[i]);
    if ((v < 0 || v >= n) && !(has_ignore && v == ignore)) {
      MT_CHECK(false, op, "{} {} at flat position {} of {} is out of range [0, {})", what, v, i, shape_str(shape),
               n);
    }
  }
}

// How many of `host_targets` (integer, contiguous, on the host) are not `ignore`, after checking each against
// [0, n): an error names the op and the target's position in `shape`, the caller's view of them.
inline std::int64_t count_checked_targets(const char* op, const Tensor& host_targets, std::int64_t n,
                                          std::int64_t ignore, const Shape& shape) {
  const std::int64_t count_in = host_targets.numel();
  std::int64_t count = 0;
  dispatch_index(host_targets.dtype(), [&](auto izero) {
    using I = decltype(izero);
    const I* tp = host_targets.data<I>();
    check_index_range(op, "target", tp, count_in, n, true, ignore, shape);
    for (std::int64_t i = 0; i < count_in; ++i) count += static_cast<std::int64_t>(tp[i]) != ignore;
  });
  return count;
}

// Operands of one op live on one device: a clear error instead of a kernel reading foreign memory.
inline void check_same_device(const char* op, const char* what_a, const Tensor& a, const char* what_b,
                              const Tensor& b) {
  MT_CHECK(a.device() == b.device(), op,
           "{} {} is on {} but {} {} is on {}: all operands must be on one device", what_a, shape_str(a.shape()),
           a.device().str(), what_b, shape_str(b.shape()), b.device().str());
}

// A contiguous index tensor on a CUDA device, copied to the host (a small [N] vector; the copy waits for
// the device) so the front-end can range-check it like the CPU path does.
inline Tensor index_to_host(const char* op, const char* what, const Tensor& t) {
  MT_CHECK(t.is_contiguous(), op, "non-contiguous {} on {} are not supported yet: {} has strides {}", what,
           t.device().str(), shape_str(t.shape()), shape_str(t.strides()));
  return t.detach().to(Device::cpu());
}

}  // namespace memtrain::detail
