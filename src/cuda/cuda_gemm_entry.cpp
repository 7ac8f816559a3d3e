// The CUDA backend's gemm_f32 entry (src/core/backend.h): one cuBLAS GEMM (cuda::gemm) over 2-D f32 views, full f32
// compute (CUBLAS_COMPUTE_32F, never TF32), or one cuBLASLt GEMM (cuda::gemm_lt) of bf16 / f16 operands into f32;
// transposed views read in place, accumulating into out when beta is 1.
#include "cuda/cuda_backend_entries.h"

#include "core/matrix_operand.h"
#include "cuda/device_ops.h"
#include "cuda/gemm_lt.h"

namespace memtrain::cuda {

void CudaBackend::gemm_f32(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                           double alpha, double beta) const {
  const ::memtrain::detail::GemmDims d = ::memtrain::detail::check_gemm_operands(out, a, b, trans_a, trans_b);
  // A column-major operand is its transpose stored row-major.
  const ::memtrain::detail::MatrixOperand A = ::memtrain::detail::as_operand(a);
  const ::memtrain::detail::MatrixOperand B = ::memtrain::detail::as_operand(b);
  if (a.dtype() == DType::f32) {
    cuda::gemm(DType::f32, trans_a != A.trans, trans_b != B.trans, d.m, d.n, d.k, static_cast<float>(alpha),
               A.tensor.data_ptr(), A.ld, B.tensor.data_ptr(), B.ld, static_cast<float>(beta), out.data_ptr(), d.ldc,
               out.device().index);
    return;
  }
  // bf16 / f16 operands: cuBLASLt's narrow x narrow -> f32 product, accumulated in f32.
  GemmLtArgs args;
  args.a_type = args.b_type = a.dtype();
  args.c_type = DType::f32;
  args.trans_a = trans_a != A.trans;
  args.trans_b = trans_b != B.trans;
  args.m = d.m;
  args.n = d.n;
  args.k = d.k;
  args.lda = A.ld;
  args.ldb = B.ld;
  args.ldc = d.ldc;
  args.alpha = static_cast<float>(alpha);
  args.beta = static_cast<float>(beta);
  cuda::gemm_lt(args, A.tensor.data_ptr(), B.tensor.data_ptr(), out.data_ptr(), out.device().index);
}

bool CudaBackend::gemm_narrow_native(DType dtype) const { return dtype == DType::bf16 || dtype == DType::f16; }

}  // namespace memtrain::cuda
