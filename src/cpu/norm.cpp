// Layer norm and RMS norm on the CPU: the kernels, and the CPU backend's entries that run them (bottom).
// The kernels work over the last dim of a contiguous (N, C) array, llm.c style: the forward writes the per-row
// statistics the backward needs (mean, rstd), the backward reads x again instead of a saved normalised copy.
// Row statistics accumulate in double (a row of C floats summed in float loses digits for C in the thousands);
// per-element math stays in T. Rows are split across OpenMP threads; dweight/dbias are summed per thread and
// then reduced in thread order (deterministic for a given thread count). weight/bias may be null (no affine).
#include "cpu/cpu_backend.h"

#include <algorithm>

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

}  // namespace

// ---- the CPU backend's entries (src/core/backend.h) ----

DType CpuBackend::norm_stats_dtype(DType x) const { return compute_dtype(x); }

namespace {

// layer_norm's forward for a contiguous bf16/f16 x: the f32 copies of x and of the output exist one slab of
// rows at a time (at most kNarrowSlabElements floats each) instead of at full size, since mixed precision keeps
// activations narrow to halve them and full-size f32 temporaries would give that back at the forward's peak.
// Each row is normalised by the same kernel as on the widened path, so the results are the same bits.
constexpr std::int64_t kNarrowSlabElements = std::int64_t{1} << 19;

void layer_norm_forward_narrow(const CpuBackend& backend, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                               const Tensor& x, const Tensor& wc, const Tensor& bc, double eps) {
  const std::int64_t C = x.size(-1), N = x.numel() / C;
  const std::int64_t slab = std::min(N, std::max<std::int64_t>(1, kNarrowSlabElements / C));
  const Tensor x2 = x.detach().reshape({N, C}), out2 = out.reshape({N, C});
  const Tensor xs = Tensor::empty({slab, C}, DType::f32, x.device());
  const Tensor ys = Tensor::empty({slab, C}, DType::f32, x.device());
  for (std::int64_t r0 = 0; r0 < N; r0 += slab) {
    const std::int64_t r = std::min(slab, N - r0);
    xs.narrow(0, 0, r).copy_(x2.narrow(0, r0, r));
    if (backend.runs_kernels())
      layer_norm_forward<float>(ys.data<float>(), mean.data<float>() + r0, rstd.data<float>() + r0, xs.data<float>(),
                                data_or_null<float>(wc), data_or_null<float>(bc), r, C, eps);
    out2.narrow(0, r0, r).copy_(ys.narrow(0, 0, r));
  }
}

}  // namespace

void CpuBackend::layer_norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                    const Tensor& weight, const Tensor& bias, double eps) const {
  const Tensor wc = compute_operand(weight), bc = compute_operand(bias);
  if ((x.dtype() == DType::bf16 || x.dtype() == DType::f16) && x.is_contiguous() && x.numel() > 0) {
    layer_norm_forward_narrow(*this, out, mean, rstd, x, wc, bc, eps);
    return;
  }
  const Tensor xc = compute_operand(x);
  const Tensor y = compute_result(out, xc.dtype());
  const std::int64_t C = xc.size(-1), N = xc.numel() / C;
  if (runs_kernels()) {
    dispatch_compute("layer_norm", xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::layer_norm_forward<T>(y.data<T>(), mean.data<T>(), rstd.data<T>(), xc.data<T>(), data_or_null<T>(wc),
                                 data_or_null<T>(bc), N, C, eps);
    });
  }
  finish_result(out, y);
}

void CpuBackend::layer_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                     const Tensor& x, const Tensor& weight, const Tensor& mean,
                                     const Tensor& rstd) const {
  const Tensor g = compute_operand(dout), xc = compute_operand(x), wc = compute_operand(weight);
  const DType ct = xc.dtype();
  const Tensor dxc = compute_result(dx, ct), dwc = compute_result(dw, ct), dbc = compute_result(db, ct);
  const std::int64_t C = xc.size(-1), N = xc.numel() / C;
  if (runs_kernels()) {
    dispatch_compute("layer_norm_backward", ct, [&](auto zero) {
      using T = decltype(zero);
      cpu::layer_norm_backward<T>(dxc.data<T>(), data_or_null<T>(dwc), data_or_null<T>(dbc), g.data<T>(),
                                  xc.data<T>(), data_or_null<T>(wc), mean.data<T>(), rstd.data<T>(), N, C);
    });
  }
  finish_result(dx, dxc);
  finish_result(dw, dwc);
  finish_result(db, dbc);
}

void CpuBackend::rms_norm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                                  double eps) const {
  const Tensor xc = compute_operand(x), wc = compute_operand(weight);
  const Tensor y = compute_result(out, xc.dtype());
  const std::int64_t C = xc.size(-1), N = xc.numel() / C;
  if (runs_kernels()) {
    dispatch_compute("rms_norm", xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      cpu::rms_norm_forward<T>(y.data<T>(), rstd.data<T>(), xc.data<T>(), data_or_null<T>(wc), N, C, eps);
    });
  }
  finish_result(out, y);
}

void CpuBackend::rms_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                                   const Tensor& weight, const Tensor& rstd) const {
  const Tensor g = compute_operand(dout), xc = compute_operand(x), wc = compute_operand(weight);
  const DType ct = xc.dtype();
  const Tensor dxc = compute_result(dx, ct), dwc = compute_result(dw, ct);
  const std::int64_t C = xc.size(-1), N = xc.numel() / C;
  if (runs_kernels()) {
    dispatch_compute("rms_norm_backward", ct, [&](auto zero) {
      using T = decltype(zero);
      cpu::rms_norm_backward<T>(dxc.data<T>(), data_or_null<T>(dwc), g.data<T>(), xc.data<T>(), data_or_null<T>(wc),
                                rstd.data<T>(), N, C);
    });
  }
  finish_result(dx, dxc);
  finish_result(dw, dwc);
}

}  // namespace memtrain::cpu
