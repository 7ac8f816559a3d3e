// The CUDA backend's matmul and linear entries (src/core/backend.h) over cuBLAS (cuda::gemm) and cuBLASLt
// (cuda::gemm_lt). f32, bf16 or f16, accumulated in f32; f32 never on TF32.
#include "cuda/cuda_backend_entries.h"

#include "core/matrix_operand.h"
#include "cuda/device_ops.h"
#include "cuda/elementwise.h"
#include "cuda/gemm_lt.h"

#include <cstdint>

namespace memtrain::cuda {

using ::memtrain::detail::as_operand;
using ::memtrain::detail::MatrixOperand;

// A 2-D B shared by a batch of A's runs as one cuBLAS GEMM over A's matrices stacked row after row (a
// contiguous copy of A only when its matrices do not stack); batched A and B run as one strided-batched
// cuBLASLt GEMM that reads transposed views through their strides, as the CPU path does.
void CudaBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b) const {
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (out.numel() == 0) return;
  if (k == 0) {  // an empty sum; cuBLASLt refuses k = 0
    fill(out, 0.0);
    return;
  }
  const std::int64_t batch = out.numel() / (m * n);
  const int device = a.device().index;
  if (b.dim() == 2) {
    MatrixOperand A = as_operand(a);
    if (batch > 1 && (A.trans || A.batch_stride != m * A.ld)) A = as_operand(a.detach().contiguous());
    const MatrixOperand B = as_operand(b);
    gemm(a.dtype(), A.trans, B.trans, batch * m, n, k, 1.0f, A.tensor.data_ptr(), A.ld, B.tensor.data_ptr(), B.ld, 0.0f,
         out.data_ptr(), n, device);
    return;
  }
  const MatrixOperand A = as_operand(a), B = as_operand(b);
  GemmLtArgs g;
  g.a_type = g.b_type = g.c_type = a.dtype();
  g.trans_a = A.trans;
  g.trans_b = B.trans;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = A.ld;
  g.ldb = B.ld;
  g.ldc = n;
  g.batch = batch;
  g.stride_a = A.batch_stride;
  g.stride_b = B.batch_stride;
  g.stride_c = m * n;
  gemm_lt(g, A.tensor.data_ptr(), B.tensor.data_ptr(), out.data_ptr(), device);
}

// The product rounded into out, then the bias added in place by the elementwise add kernel: the numbers of
// matmul followed by add, without a second [N, out] buffer.
void CudaBackend::linear_forward(const Tensor& out, const Tensor& x, const Tensor& weight,
                                 const Tensor& bias) const {
  matmul(out, x, weight.detach().t());
  if (out.numel() == 0) return;
  const Shape shape = out.shape();
  const Shape bias_strides{0, bias.stride(0)};
  elementwise_binary(cuda::BinaryOp::add, out.data_ptr(), out.data_ptr(), out.strides().data(), bias.data_ptr(),
                     bias_strides.data(), shape.data(), 2, out.dtype(), 0.0, 0.0, out.device().index);
}

}  // namespace memtrain::cuda
