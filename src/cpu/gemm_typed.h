// gemm<T>: the float/double GEMMs of cpu/gemm.h behind one name, so kernels templated on the element type
// (f32 for training, f64 for gradient checks) call a single function.
#pragma once

#include "cpu/gemm.h"

namespace memtrain::cpu {

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm_f64(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace memtrain::cpu
