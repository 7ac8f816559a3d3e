// The front of cpu/gemm.h: argument checks, the degenerate cases, backend choice, and the bf16 path for
// CPUs (or backends) without a native bf16 GEMM. The products themselves are in gemm_eigen.cpp and
// gemm_onednn.cpp.
#include "cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "cpu/gemm_impl.h"
#include "memtrain/core/error.h"

namespace memtrain::detail {

bool split_batch(const GemmDims& d) {
  const int64_t threads = omp_get_max_threads();
  if (d.batch < 2 || threads < 2 || d.batch < threads || omp_in_parallel()) return false;
  // Below ~4 MFLOP a product is too small to share between threads efficiently.
  const bool small = 2.0 * double(d.m) * double(d.n) * double(d.k) < 4e6;
  return small || d.batch % threads == 0 || d.batch >= 4 * threads;
}

}  // namespace memtrain::detail

namespace memtrain::cpu {
namespace {

using detail::GemmDims;

#if defined(MEMTRAIN_HAVE_ONEDNN)
constexpr bool kHaveOnednn = true;
#else
constexpr bool kHaveOnednn = false;
#endif

std::atomic<GemmBackend> g_backend{kHaveOnednn ? GemmBackend::onednn : GemmBackend::eigen};

bool use_onednn() { return kHaveOnednn && g_backend.load(std::memory_order_relaxed) == GemmBackend::onednn; }

GemmDims make_dims(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                   int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  GemmDims d;
  d.trans_a = trans_a;
  d.trans_b = trans_b;
  d.m = m, d.n = n, d.k = k;
  d.lda = lda, d.ldb = ldb, d.ldc = ldc;
  d.batch = batch;
  d.stride_a = stride_a, d.stride_b = stride_b, d.stride_c = stride_c;
  return d;
}

void check_args(const char* dtype, const GemmDims& d, const void* a, const void* b, const void* c) {
  MT_CHECK(d.m >= 0 && d.n >= 0 && d.k >= 0 && d.batch >= 0, "gemm",
           "{}: sizes must be non-negative, got m={} n={} k={} batch={}", dtype, d.m, d.n, d.k, d.batch);
  // A is stored [m,k], or [k,m] when transposed; each stored row must fit in its leading dimension. An
  // empty row allows ld = 0 (what a contiguous [m,0] tensor reports); such calls never reach a backend.
  const int64_t a_rows = d.trans_a ? d.k : d.m, a_cols = d.trans_a ? d.m : d.k;
  const int64_t b_rows = d.trans_b ? d.n : d.k, b_cols = d.trans_b ? d.k : d.n;
  MT_CHECK(d.lda >= a_cols, "gemm",
           "{}: lda={} is smaller than the row length of A (stored [{},{}], trans_a={})", dtype, d.lda, a_rows,
           a_cols, d.trans_a);
  MT_CHECK(d.ldb >= b_cols, "gemm",
           "{}: ldb={} is smaller than the row length of B (stored [{},{}], trans_b={})", dtype, d.ldb, b_rows,
           b_cols, d.trans_b);
  MT_CHECK(d.ldc >= d.n, "gemm", "{}: ldc={} is smaller than the row length of C [{},{}]",
           dtype, d.ldc, d.m, d.n);
  MT_CHECK(d.stride_a >= 0 && d.stride_b >= 0 && d.stride_c >= 0, "gemm",
           "{}: batch strides must be non-negative, got {}, {}, {}", dtype, d.stride_a, d.stride_b, d.stride_c);
  if (d.batch > 1 && d.m > 0 && d.n > 0) {
    MT_CHECK(d.stride_c >= (d.m - 1) * d.ldc + d.n, "gemm",
             "{}: stride_c={} makes the [{},{}] output matrices (ldc={}) overlap", dtype, d.stride_c, d.m, d.n,
             d.ldc);
  }
  if (d.batch == 0 || d.m == 0 || d.n == 0) return;
  MT_CHECK(c != nullptr, "gemm", "{}: C is null for a [{},{}] output", dtype, d.m, d.n);
  if (d.k > 0) {
    MT_CHECK(a != nullptr && b != nullptr, "gemm", "{}: A or B is null (m={} n={} k={})", dtype, d.m, d.n, d.k);
  }
}

// C = beta * C for every matrix of the batch, the whole answer when k == 0 or alpha == 0.
template <class T>
void scale_c(const GemmDims& d, T beta, T* c) {
  for (int64_t i = 0; i < d.batch; ++i) {
    for (int64_t r = 0; r < d.m; ++r) {
      T* row = c + i * d.stride_c + r * d.ldc;
      if (beta == T(0)) {
        std::fill(row, row + d.n, T(0));  // not beta * row: C may hold NaN and must not be read
      } else if (beta != T(1)) {
        for (int64_t j = 0; j < d.n; ++j) row[j] *= beta;
      }
    }
  }
}

// True when the product itself has to run (checked; otherwise C has been scaled and the call is done).
template <class T>
bool needs_product(const char* dtype, const GemmDims& d, const void* a, const void* b, T alpha, T beta, T* c) {
  check_args(dtype, d, a, b, c);
  if (d.batch == 0 || d.m == 0 || d.n == 0) return false;
  if (d.k == 0 || alpha == T(0)) {
    scale_c(d, beta, c);
    return false;
  }
  return true;
}

void run_f32(const GemmDims& d, float alpha, const float* a, const float* b, float beta, float* c) {
  if (use_onednn()) {
    detail::onednn_gemm_f32(d, alpha, a, b, beta, c);
  } else {
    detail::eigen_gemm_f32(d, alpha, a, b, beta, c);
  }
}

// Copies the stored block rows [row0, row0+rows) x cols [col0, col0+cols) of a bf16 matrix into a dense
// f32 block (ld = cols). bf16 is the top half of an f32, so widening is exact.
void widen_block(const uint16_t* src, int64_t ld, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                 float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* in = src + (row0 + r) * ld + col0;
    float* out = dst + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t bits = static_cast<uint32_t>(in[j]) << 16;
      std::memcpy(out + j, &bits, sizeof(float));
    }
  }
}

// One bf16 product without a native kernel: widen k-blocks of A and B to f32 (into a_blk [m,kb] and
// b_blk [kb,n]) and accumulate the block products into C with the f32 GEMM.
void widened_product(const GemmDims& d, int64_t kb, float alpha, const uint16_t* a, const uint16_t* b,
                     float beta, float* c, float* a_blk, float* b_blk) {
  for (int64_t k0 = 0; k0 < d.k; k0 += kb) {
    const int64_t kc = std::min(kb, d.k - k0);
    // Each block keeps the operand's own orientation, so the f32 GEMM sees the same transposes.
    if (d.trans_a) {
      widen_block(a, d.lda, k0, kc, 0, d.m, a_blk);
    } else {
      widen_block(a, d.lda, 0, d.m, k0, kc, a_blk);
    }
    if (d.trans_b) {
      widen_block(b, d.ldb, 0, d.n, k0, kc, b_blk);
    } else {
      widen_block(b, d.ldb, k0, kc, 0, d.n, b_blk);
    }
    GemmDims blk = d;
    blk.k = kc;
    blk.lda = d.trans_a ? d.m : kc;
    blk.ldb = d.trans_b ? kc : d.n;
    blk.batch = 1;
    run_f32(blk, alpha, a_blk, b_blk, k0 == 0 ? beta : 1.0f, c);
  }
}

// The block depth keeps the scratch near 16 MiB per thread however large the operands are, while the block
// products stay deep enough (>= 256) to run at full f32 speed. The scratch is allocated up front, one slice
// per thread when the batch is split, since nothing may throw inside the parallel region.
void gemm_bf16_widened(const GemmDims& d, float alpha, const uint16_t* a, const uint16_t* b, float beta,
                       float* c) {
  const int64_t budget_floats = int64_t{4} << 20;
  const int64_t kb = std::min(d.k, std::max<int64_t>(256, budget_floats / (d.m + d.n)));
  const int64_t slice = (d.m + d.n) * kb;
  const bool split = detail::split_batch(d);
  std::vector<float> scratch(static_cast<size_t>(slice * (split ? omp_get_max_threads() : 1)));
  detail::for_each_gemm_in_batch(d, [&](int64_t i) {
    float* a_blk = scratch.data() + (split ? omp_get_thread_num() : 0) * slice;
    widened_product(d, kb, alpha, a + i * d.stride_a, b + i * d.stride_b, beta, c + i * d.stride_c, a_blk,
                    a_blk + d.m * kb);
  });
}

void run_bf16(const GemmDims& d, float alpha, const uint16_t* a, const uint16_t* b, float beta, float* c) {
  if (use_onednn() && detail::onednn_matmul(/*in_bf16=*/true, d, alpha, a, b, beta, c)) return;
  gemm_bf16_widened(d, alpha, a, b, beta, c);
}

}  // namespace

GemmBackend gemm_backend() { return g_backend.load(); }

void set_gemm_backend(GemmBackend backend) {
  MT_CHECK(backend != GemmBackend::onednn || kHaveOnednn, "gemm",
           "backend onednn requested, but this build of memtrain has no oneDNN (configure with "
           "MEMTRAIN_ONEDNN=ON and libdnnl-dev installed)");
  g_backend.store(backend);
}

const char* gemm_backend_name(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::onednn: return "onednn";
    case GemmBackend::eigen: return "eigen";
  }
  return "?";
}

bool gemm_onednn_available() { return kHaveOnednn; }

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const GemmDims d = make_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc, 1, 0, 0, 0);
  if (needs_product("f32", d, a, b, alpha, beta, c)) run_f32(d, alpha, a, b, beta, c);
}

void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
              int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  const GemmDims d = make_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc, 1, 0, 0, 0);
  if (needs_product("f64", d, a, b, alpha, beta, c)) detail::eigen_gemm_f64(d, alpha, a, b, beta, c);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const GemmDims d = make_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc, 1, 0, 0, 0);
  if (needs_product("bf16", d, a, b, alpha, beta, c)) run_bf16(d, alpha, a, b, beta, c);
}

void gemm_batched_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                      int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  const GemmDims d = make_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c);
  if (needs_product("f32", d, a, b, alpha, beta, c)) run_f32(d, alpha, a, b, beta, c);
}

void gemm_batched_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                      const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                      int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  const GemmDims d = make_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c);
  if (needs_product("f64", d, a, b, alpha, beta, c)) detail::eigen_gemm_f64(d, alpha, a, b, beta, c);
}

void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                       int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  const GemmDims d = make_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c);
  if (needs_product("bf16", d, a, b, alpha, beta, c)) run_bf16(d, alpha, a, b, beta, c);
}

}  // namespace memtrain::cpu
