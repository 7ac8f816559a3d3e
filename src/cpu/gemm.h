// CPU matrix multiply: the one door every CPU matmul goes through.
//
// All matrices are row-major. C[m,n] = alpha * op(A) * op(B) + beta * C, where op(A) is [m,k] (A is stored
// [k,m] when trans_a) and op(B) is [k,n] (B is stored [n,k] when trans_b). lda/ldb/ldc are row strides in
// elements. Transposes are read in place; no operand is copied (except bf16 without native support, below).
// BLAS conventions: beta == 0 means C is not read (NaNs in C are overwritten); alpha == 0 or k == 0 means
// A and B are not read and C = beta * C.
//
// Backends: oneDNN (default when built in) and Eigen (always built). f64 always runs on Eigen (oneDNN has
// no f64 GEMM). bf16 runs oneDNN's bf16 matmul (fp32 accumulate) when the CPU supports it; otherwise the
// bf16 inputs are widened to f32 block by block (exactly: bf16 -> f32 is lossless) and the f32 path runs.
// Threads: OpenMP, omp_get_max_threads() at the time of the call. All entry points are thread-safe.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

enum class GemmBackend { onednn, eigen };

// The backend in use (process-wide). Default: onednn when built with it, else eigen.
GemmBackend gemm_backend();
// Throws memtrain::Error when asked for onednn in a build without it.
void set_gemm_backend(GemmBackend backend);
const char* gemm_backend_name(GemmBackend backend);
// True when this build links oneDNN.
bool gemm_onednn_available();

// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
              int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);
// a and b hold bf16 bit patterns; accumulation and C are f32.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

// batch independent products: matrix i of A starts at a + i * stride_a (likewise B, C). A stride of 0
// for A or B reuses one matrix for every batch entry (e.g. shared weights); C's matrices must not overlap.
void gemm_batched_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                      int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);
void gemm_batched_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                      const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                      int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);
void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                       int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);

}  // namespace memtrain::cpu
