// The CUDA backend's gemm_f32 entry (src/core/backend.h): one cuBLAS GEMM (cuda::gemm) over 2-D f32 views, full f32
// compute (CUBLAS_COMPUTE_32F, never TF32), transposed views read in place, accumulating into out when beta is 1.
#include "cuda/cuda_backend_entries.h"

#include "core/matrix_operand.h"
#include "cuda/device_ops.h"

namespace memtrain::cuda {

void CudaBackend::gemm_f32(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                           double alpha, double beta) const {
  const ::memtrain::detail::GemmDims d = ::memtrain::detail::check_gemm_operands(out, a, b, trans_a, trans_b);
  // A column-major operand is its transpose stored row-major.
  const ::memtrain::detail::MatrixOperand A = ::memtrain::detail::as_operand(a);
  const ::memtrain::detail::MatrixOperand B = ::memtrain::detail::as_operand(b);
  cuda::gemm(DType::f32, trans_a != A.trans, trans_b != B.trans, d.m, d.n, d.k, static_cast<float>(alpha),
             A.tensor.data_ptr(), A.ld, B.tensor.data_ptr(), B.ld, static_cast<float>(beta), out.data_ptr(), d.ldc,
             out.device().index);
}

}  // namespace memtrain::cuda
