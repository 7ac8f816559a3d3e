// The CUDA backend object: the contract of src/core/backend.h over the raw launchers of src/cuda/ and
// kernels/. Entries are defined beside their family's host code: cuda_tensor_backend.cpp (memory, the
// tensor core), norm.cu (normalisation, with its kernels), cuda_elementwise.cpp (elementwise, selection), cuda_reduce.cpp. Each entry checks what its kernels cannot take (dtype set, one dtype for
// every operand, contiguity), naming the op, then launches on the device's current stream.
#pragma once

#include "core/backend.h"

#include <initializer_list>
#include <utility>

namespace memtrain::cuda {

class CudaBackend final : public ::memtrain::detail::Backend {
 public:
  int device_count() const override;
  // Every entry of the contract (core/backend_entries.def), defined in the files named above.
#define MT_BACKEND_ENTRY(ret, name, params) ret name params const override;
#include "core/backend_entries.def"
#undef MT_BACKEND_ENTRY
};

// ---- helpers of the entries ----

inline const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
inline void* out_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The nn kernels' contract: x f32, bf16 or f16, contiguous; every other defined operand in x's dtype and
// contiguous. Throws naming the op and the operand.
void check_nn_operands(const char* op, const Tensor& x,
                       std::initializer_list<std::pair<const char*, const Tensor*>> others);

}  // namespace memtrain::cuda
