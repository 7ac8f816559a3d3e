#include "cpu/cross_entropy.h"

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
MEMTRAIN_INSTANTIATE(float, int32_t)
MEMTRAIN_INSTANTIATE(float, int64_t)
MEMTRAIN_INSTANTIATE(double, int32_t)
MEMTRAIN_INSTANTIATE(double, int64_t)
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cpu
