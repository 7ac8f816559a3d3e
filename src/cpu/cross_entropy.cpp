#include "cpu/cross_entropy.h"

#include "core/operand_checks.h"
#include "cpu/cpu_backend.h"
#include "cpu/instantiate.h"

#include "cpu/fast_exp.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace memtrain::cpu {

template <typename T, typename I>
void cross_entropy_forward(T* losses, T* lse, const T* logits, const I* targets, int64_t N, int64_t V,
                           int64_t ignore_index) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;  // (V)
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
    const T s = exp_shifted(x, m, static_cast<T*>(nullptr), V);  // sum of e^(x - m), vectorized
    lse[n] = m + std::log(s);
    const int64_t t = static_cast<int64_t>(targets[n]);
    losses[n] = t == ignore_index ? T(0) : lse[n] - x[t];
  }
}

template <typename T, typename I>
void cross_entropy_backward(T* dlogits, const T* dloss, int64_t dloss_stride, const T* logits, const T* lse,
                            const I* targets, int64_t N, int64_t V, int64_t ignore_index) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;  // (V)
    T* dx = dlogits + n * V;
    const int64_t t = static_cast<int64_t>(targets[n]);
    if (t == ignore_index) {
      std::fill(dx, dx + V, T(0));
      continue;
    }
    const T g = dloss[n * dloss_stride], l = lse[n];
    exp_shifted_scaled(x, l, g, dx, V);  // g * softmax(x)
    dx[t] -= g;
  }
}

#define MEMTRAIN_INSTANTIATE(T, I)                                                                               \
  template void cross_entropy_forward<T, I>(T*, T*, const T*, const I*, int64_t, int64_t, int64_t);              \
  template void cross_entropy_backward<T, I>(T*, const T*, int64_t, const T*, const T*, const I*, int64_t,       \
                                             int64_t, int64_t);
MEMTRAIN_CPU_FOR_COMPUTE_AND_INDEX_TYPES(MEMTRAIN_INSTANTIATE)
#undef MEMTRAIN_INSTANTIATE

// ---- the CPU backend's entries ----

DType CpuBackend::loss_stats_dtype(DType logits) const { return compute_dtype(logits); }

std::int64_t CpuBackend::cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits,
                                               const Tensor& targets, std::int64_t ignore_index, bool mean) const {
  const char* op = "cross_entropy";
  const std::int64_t N = logits.size(0), V = logits.size(1);
  const Tensor t = targets.is_contiguous() ? targets.detach() : targets.detach().contiguous();
  const Tensor x = compute_operand(logits);
  // Per-row losses in the compute dtype: out itself when it is per-row and in that dtype.
  const bool per_row = out.dim() == 1;
  const Tensor losses = per_row ? compute_result(out, x.dtype()) : Tensor::empty({N}, x.dtype(), x.device());
  // Meta has no targets to check or count: they read as zeros.
  std::int64_t count = ignore_index != 0 ? N : 0;
  double total = 0;
  if (runs_kernels()) {
    count = ::memtrain::detail::count_checked_targets(op, t, V, ignore_index, targets.shape());
    ::memtrain::detail::dispatch_index(t.dtype(), [&](auto izero) {
      using I = decltype(izero);
      const I* tp = t.data<I>();
      dispatch_compute(op, x.dtype(), [&](auto zero) {
        using T = decltype(zero);
        cpu::cross_entropy_forward<T, I>(losses.data<T>(), lse.data<T>(), x.data<T>(), tp, N, V, ignore_index);
        // Summed in double, in row order.
        if (!per_row)
          for (std::int64_t i = 0; i < N; ++i) total += static_cast<double>(losses.data<T>()[i]);
      });
    });
  }
  if (per_row) {
    finish_result(out, losses);
  } else {
    fill(out, !mean ? total : count > 0 ? total / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN());
  }
  return count;
}

void CpuBackend::cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                                        const Tensor& targets, const Tensor& lse, std::int64_t ignore_index,
                                        bool per_row, std::int64_t divisor) const {
  const Tensor x = compute_operand(logits), gc = compute_operand(dloss);
  const Tensor t = targets.is_contiguous() ? targets.detach() : targets.detach().contiguous();
  const Tensor dx = compute_result(dlogits, x.dtype());
  const std::int64_t N = x.size(0), V = x.size(1);
  if (runs_kernels()) {
    dispatch_compute("cross_entropy_backward", x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T scale = per_row ? T(0) : gc.data<T>()[0];
      if (!per_row) scale /= static_cast<T>(divisor);
      const T* dl = per_row ? gc.data<T>() : &scale;
      const std::int64_t stride = per_row ? 1 : 0;
      ::memtrain::detail::dispatch_index(t.dtype(), [&](auto izero) {
        using I = decltype(izero);
        cpu::cross_entropy_backward<T, I>(dx.data<T>(), dl, stride, x.data<T>(), lse.data<T>(), t.data<I>(), N, V,
                                          ignore_index);
      });
    });
  }
  finish_result(dlogits, dx);
}

}  // namespace memtrain::cpu
