// The CPU backend (the contract of src/core/backend.h): the reference every other backend is tested
// against. Its entries are defined beside their kernels: cpu_backend.cpp (memory, the tensor core),
// norm.cpp (normalisation), elementwise.cpp, reduce.cpp and select.cpp.
//
// The meta backend derives from it and only turns runs_kernels() off: every entry allocates its
// temporaries on the device of its operands and guards each kernel call with runs_kernels(), so a meta
// run allocates exactly what a CPU run does and never touches data.
#pragma once

#include "core/backend.h"

namespace memtrain::cpu {

class CpuBackend : public detail::Backend {
 public:
  // False on meta: kernels are skipped, allocations are made as on the CPU.
  virtual bool runs_kernels() const { return true; }
  bool host_addressable() const override { return runs_kernels(); }

  // Every entry of the contract (core/backend_entries.def), defined in the files named above.
#define MT_BACKEND_ENTRY(ret, name, params) ret name params const override;
#include "core/backend_entries.def"
#undef MT_BACKEND_ENTRY
};

// ---- helpers of the entries ----

// The dtype a CPU kernel computes in: f64 stays f64, every other float type computes in f32.
inline DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// t without autograd history, in its compute dtype, contiguous; no copy when it already is all three.
// An undefined t stays undefined (an absent weight or bias).
Tensor compute_operand(const Tensor& t);

// Where a kernel writes a result that belongs in `dst`: dst itself when it is contiguous and in the compute
// dtype `ct`, otherwise a new buffer on dst's device that finish_result() copies into dst.
Tensor compute_result(const Tensor& dst, DType ct);
void finish_result(const Tensor& dst, const Tensor& computed);

// Calls f(float{}) or f(double{}) for a compute dtype.
template <typename F>
decltype(auto) dispatch_compute(const char* op, DType t, F&& f) {
  if (t == DType::f32) return f(float{});
  MT_CHECK(t == DType::f64, op, "no CPU kernel for dtype {}", dtype_name(t));
  return f(double{});
}

// T* of a tensor that may be undefined (nullptr then).
template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace memtrain::cpu
