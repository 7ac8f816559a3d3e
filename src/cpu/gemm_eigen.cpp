// Eigen GEMM backend: row-major Eigen::Maps over the caller's buffers, so transposes and strides are read
// in place. Eigen threads its GEMM with OpenMP (omp_get_max_threads) and runs serially when called inside
// a parallel region, which the batch loop relies on.
#include "cpu/eigen.h"

#include "cpu/gemm_impl.h"

namespace memtrain::detail {
namespace {

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class T>
void eigen_gemm_one(const GemmDims& d, T alpha, const T* a, const T* b, T beta, T* c) {
  const ConstMap<T> A(a, d.trans_a ? d.k : d.m, d.trans_a ? d.m : d.k, Eigen::OuterStride<>(d.lda));
  const ConstMap<T> B(b, d.trans_b ? d.n : d.k, d.trans_b ? d.k : d.n, Eigen::OuterStride<>(d.ldb));
  MutMap<T> C(c, d.m, d.n, Eigen::OuterStride<>(d.ldc));
  // beta == 0 must not read C (it may hold NaN), so zero it rather than scale it.
  if (beta == T(0)) {
    C.setZero();
  } else if (beta != T(1)) {
    C *= beta;
  }
  // Eigen folds alpha and the transposes into one GEMM call; nothing is copied besides its own packing.
  if (!d.trans_a && !d.trans_b) {
    C.noalias() += alpha * A * B;
  } else if (d.trans_a && !d.trans_b) {
    C.noalias() += alpha * A.transpose() * B;
  } else if (!d.trans_a && d.trans_b) {
    C.noalias() += alpha * A * B.transpose();
  } else {
    C.noalias() += alpha * A.transpose() * B.transpose();
  }
}

template <class T>
void eigen_gemm(const GemmDims& d, T alpha, const T* a, const T* b, T beta, T* c) {
  for_each_gemm_in_batch(d, [&](int64_t i) {
    eigen_gemm_one(d, alpha, a + i * d.stride_a, b + i * d.stride_b, beta, c + i * d.stride_c);
  });
}

}  // namespace

void eigen_gemm_f32(const GemmDims& d, float alpha, const float* a, const float* b, float beta, float* c) {
  eigen_gemm(d, alpha, a, b, beta, c);
}

void eigen_gemm_f64(const GemmDims& d, double alpha, const double* a, const double* b, double beta,
                    double* c) {
  eigen_gemm(d, alpha, a, b, beta, c);
}

}  // namespace memtrain::detail
