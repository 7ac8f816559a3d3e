// Private to the gemm_*.cpp files (and their tests): the backend entry points behind cpu/gemm.h.
// Callers here have already validated the arguments and removed the degenerate cases: m, n, k >= 1,
// alpha != 0, batch >= 1, and every leading dimension covers its row.
#pragma once

#include <omp.h>

#include <cstdint>

namespace memtrain::detail {

// The shape of one (batched) GEMM call; see cpu/gemm.h for the meaning of each field.
struct GemmDims {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Whether a batch is split across OpenMP threads (each product then runs single-threaded; Eigen and
// oneDNN both go serial inside a parallel region) rather than run one product after another with every
// thread. Splitting avoids a fork/join per product and suits small products, but a static split of, say,
// 3 large products over 2 threads idles a thread a third of the time, so large products split only when
// the batch divides evenly or is long enough (>= 4 per thread) for the imbalance to stay under ~25%.
bool split_batch(const GemmDims& d);

// Runs fn(i) for i in [0, d.batch), split across threads when split_batch(d). fn must not throw.
template <class Fn>
void for_each_gemm_in_batch(const GemmDims& d, Fn&& fn) {
  if (split_batch(d)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.batch; ++i) fn(i);
  } else {
    for (int64_t i = 0; i < d.batch; ++i) fn(i);
  }
}

// Eigen (always built).
void eigen_gemm_f32(const GemmDims& d, float alpha, const float* a, const float* b, float beta, float* c);
void eigen_gemm_f64(const GemmDims& d, double alpha, const double* a, const double* b, double beta,
                    double* c);

// oneDNN. Without MEMTRAIN_HAVE_ONEDNN these are stubs (onednn_matmul returns false) and gemm.cpp never
// selects this backend.
void onednn_gemm_f32(const GemmDims& d, float alpha, const float* a, const float* b, float beta, float* c);
// oneDNN's matmul primitive with f32 or bf16 inputs (in_bf16) and f32 output, batched through its 3-D
// memory descriptors. Primitives are cached per shape. Returns false, having done nothing, when this CPU
// has no fast implementation for it (e.g. bf16 without AVX-512); the caller then takes another path.
bool onednn_matmul(bool in_bf16, const GemmDims& d, float alpha, const void* a, const void* b, float beta,
                   float* c);
// Number of primitives in the matmul cache (for tests).
int64_t onednn_matmul_cache_size();

}  // namespace memtrain::detail
