// Normalisation kernels. Row statistics accumulate in double (a row of C floats summed in float loses
// digits for C in the thousands); per-element math stays in T.
#include "cpu/norm.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace memtrain::cpu {

namespace {
constexpr int64_t kGrain = 1 << 14;

// Sums per-thread partial columns [nthreads, C] into dst (thread order: deterministic).
template <typename T>
void reduce_partials(T* dst, const std::vector<T>& partial, int nthreads, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    T s = 0;
    for (int t = 0; t < nthreads; ++t) s += partial[static_cast<size_t>(t * C + c)];
    dst[c] = s;
  }
}
}  // namespace

template <typename T>
void layer_norm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias, int64_t N, int64_t C,
                        double eps) {
#pragma omp parallel for schedule(static) if (N * C > kGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;  // (C)
    T* yr = out + n * C;
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += xr[c];
    const double m = s / static_cast<double>(C);
    double v = 0;
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    const T r = static_cast<T>(1.0 / std::sqrt(v / static_cast<double>(C) + eps));
    const T mt = static_cast<T>(m);
    for (int64_t c = 0; c < C; ++c) {
      const T norm = (xr[c] - mt) * r;
      yr[c] = norm * (weight ? weight[c] : T(1)) + (bias ? bias[c] : T(0));
    }
    mean[n] = mt;
    rstd[n] = r;
  }
}

template <typename T>
void layer_norm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight, const T* mean,
                         const T* rstd, int64_t N, int64_t C) {
  const bool par = N * C > kGrain;
  const int nthreads = par ? omp_get_max_threads() : 1;
  std::vector<T> dw_part(dweight ? static_cast<size_t>(nthreads * C) : 0, T(0));
  std::vector<T> db_part(dbias ? static_cast<size_t>(nthreads * C) : 0, T(0));
#pragma omp parallel num_threads(nthreads) if (par)
  {
    const int tid = omp_get_thread_num();
    T* dw = dweight ? dw_part.data() + tid * C : nullptr;
    T* db = dbias ? db_part.data() + tid * C : nullptr;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;  // (C)
      const T* gr = dout + n * C;
      T* dxr = dx + n * C;
      const T m = mean[n], r = rstd[n];
      // dnorm = dout * w; dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
      double sum_dn = 0, sum_dn_norm = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T norm = (xr[c] - m) * r;
        const T dn = gr[c] * (weight ? weight[c] : T(1));
        sum_dn += dn;
        sum_dn_norm += dn * norm;
        if (dw) dw[c] += gr[c] * norm;
        if (db) db[c] += gr[c];
      }
      const T mean_dn = static_cast<T>(sum_dn / C), mean_dn_norm = static_cast<T>(sum_dn_norm / C);
      for (int64_t c = 0; c < C; ++c) {
        const T norm = (xr[c] - m) * r;
        const T dn = gr[c] * (weight ? weight[c] : T(1));
        dxr[c] = r * (dn - mean_dn - norm * mean_dn_norm);
      }
    }
  }
  if (dweight) reduce_partials(dweight, dw_part, nthreads, C);
  if (dbias) reduce_partials(dbias, db_part, nthreads, C);
}

template <typename T>
void rms_norm_forward(T* out, T* rstd, const T* x, const T* weight, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (N * C > kGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;  // (C)
    T* yr = out + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * (weight ? weight[c] : T(1));
    rstd[n] = r;
  }
}

template <typename T>
void rms_norm_backward(T* dx, T* dweight, const T* dout, const T* x, const T* weight, const T* rstd, int64_t N,
                       int64_t C) {
  const bool par = N * C > kGrain;
  const int nthreads = par ? omp_get_max_threads() : 1;
  std::vector<T> dw_part(dweight ? static_cast<size_t>(nthreads * C) : 0, T(0));
#pragma omp parallel num_threads(nthreads) if (par)
  {
    T* dw = dweight ? dw_part.data() + omp_get_thread_num() * C : nullptr;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;  // (C)
      const T* gr = dout + n * C;
      T* dxr = dx + n * C;
      const T r = rstd[n];
      // dx = rstd * (dout * w - norm * mean(dout * w * norm)), norm = x * rstd
      double s = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T norm = xr[c] * r;
        s += gr[c] * (weight ? weight[c] : T(1)) * norm;
        if (dw) dw[c] += gr[c] * norm;
      }
      const T mean_s = static_cast<T>(s / C);
      for (int64_t c = 0; c < C; ++c) dxr[c] = r * (gr[c] * (weight ? weight[c] : T(1)) - xr[c] * r * mean_s);
    }
  }
  if (dweight) reduce_partials(dweight, dw_part, nthreads, C);
}

#define MEMTRAIN_INSTANTIATE(T)                                                                                  \
  template void layer_norm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, double);       \
  template void layer_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t,     \
                                       int64_t);                                                                 \
  template void rms_norm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                       \
  template void rms_norm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);
MEMTRAIN_INSTANTIATE(float)
MEMTRAIN_INSTANTIATE(double)
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cpu
