// Row-wise (inner == 1) rows are three passes over contiguous memory: max, sum of exp, write. For inner > 1
// the same passes run over the C planes of one outer block with per-column accumulators, so memory is still
// read in order.
#include "cpu/softmax.h"

#include "cpu/cpu_backend.h"
#include "cpu/instantiate.h"

#include "cpu/fast_exp.h"

#include <cmath>
#include <limits>
#include <vector>

namespace memtrain::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per outer block below which threads are not worth it

// max and log-sum-exp of one contiguous row.
template <typename T>
void row_max_lse(const T* x, int64_t C, T* mx, T* lse) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < C; ++c) m = std::max(m, x[c]);
  const T s = exp_shifted(x, m, static_cast<T*>(nullptr), C);
  *mx = m;
  *lse = std::log(s);
}

// Per outer block: max and log-sum-exp of every column (o, :, i); calls emit(o, max, lse, inner) with arrays of
// `inner` (a literal 1 on the row path, so the emitter's loops collapse).
template <typename T, typename Emit>
void for_each_block(const T* x, int64_t outer, int64_t C, int64_t inner, Emit emit) {
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (outer * C > kGrain)
    for (int64_t o = 0; o < outer; ++o) {
      T mx = 0, lse = 0;
      row_max_lse(x + o * C, C, &mx, &lse);
      emit(o, &mx, &lse, int64_t{1});
    }
    return;
  }
#pragma omp parallel if (outer * C * inner > kGrain)
  {
    std::vector<T> mx(static_cast<size_t>(inner)), lse(static_cast<size_t>(inner));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const T* xo = x + o * C * inner;
      for (int64_t i = 0; i < inner; ++i) mx[i] = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < inner; ++i) mx[i] = std::max(mx[i], xo[c * inner + i]);
      for (int64_t i = 0; i < inner; ++i) lse[i] = 0;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < inner; ++i) lse[i] += std::exp(xo[c * inner + i] - mx[i]);
      for (int64_t i = 0; i < inner; ++i) lse[i] = std::log(lse[i]);
      emit(o, mx.data(), lse.data(), inner);
    }
  }
}

// Both forwards, per outer block: z = x - max - lse, written as is (log-softmax) or as e^z (softmax).
template <bool Log, typename T>
void forward_blocks(T* out, const T* x, int64_t outer, int64_t C, int64_t inner) {
  for_each_block(x, outer, C, inner, [&](int64_t o, const T* mx, const T* lse, int64_t inner) {
    const T* xo = x + o * C * inner;
    T* yo = out + o * C * inner;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const T z = xo[c * inner + i] - mx[i] - lse[i];
        if constexpr (Log) {
          yo[c * inner + i] = z;
        } else {
          yo[c * inner + i] = std::exp(z);
        }
      }
  });
}

}  // namespace

template <typename T>
void softmax_forward(T* out, const T* x, int64_t outer, int64_t C, int64_t inner) {
  forward_blocks<false>(out, x, outer, C, inner);
}

template <typename T>
void log_softmax_forward(T* out, const T* x, int64_t outer, int64_t C, int64_t inner) {
  forward_blocks<true>(out, x, outer, C, inner);
}

namespace {

// Shared shape of both backwards, per outer block: s = sum over c of weight(c), one per column, then
// dx(c) = grad(c, s). softmax: weight = dout * out, dx = out * (dout - s); log-softmax: weight = dout,
// dx = dout - e^out * s.
template <typename T, typename Weight, typename Grad>
void softmax_backward_blocks(T* dx, const T* dout, const T* out, int64_t outer, int64_t C, int64_t inner,
                             Weight weight, Grad grad) {
#pragma omp parallel if (outer * C * inner > kGrain)
  {
    std::vector<T> s(static_cast<size_t>(inner));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const int64_t base = o * C * inner;
      for (int64_t i = 0; i < inner; ++i) s[i] = 0;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < inner; ++i) s[i] += weight(dout[base + c * inner + i], out[base + c * inner + i]);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t e = base + c * inner + i;
          dx[e] = grad(dout[e], out[e], s[i]);
        }
    }
  }
}

}  // namespace

template <typename T>
void softmax_backward(T* dx, const T* dout, const T* out, int64_t outer, int64_t C, int64_t inner) {
  softmax_backward_blocks(
      dx, dout, out, outer, C, inner, [](T g, T y) { return g * y; }, [](T g, T y, T s) { return y * (g - s); });
}

template <typename T>
void log_softmax_backward(T* dx, const T* dout, const T* out, int64_t outer, int64_t C, int64_t inner) {
  softmax_backward_blocks(
      dx, dout, out, outer, C, inner, [](T g, T) { return g; }, [](T g, T y, T s) { return g - std::exp(y) * s; });
}

#define MEMTRAIN_INSTANTIATE(T)                                                                  \
  template void softmax_forward<T>(T*, const T*, int64_t, int64_t, int64_t);                     \
  template void softmax_backward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);          \
  template void log_softmax_forward<T>(T*, const T*, int64_t, int64_t, int64_t);                 \
  template void log_softmax_backward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);
MEMTRAIN_CPU_FOR_COMPUTE_TYPES(MEMTRAIN_INSTANTIATE)
#undef MEMTRAIN_INSTANTIATE

// ---- the CPU backend's entries ----

namespace {

struct Layout {
  std::int64_t outer = 1, C = 1, inner = 1;
};

// shape viewed as (outer, C, inner) around dim.
Layout layout_of(const Shape& shape, std::int64_t dim) {
  Layout l;
  for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
    if (d < dim) l.outer *= shape[d];
    if (d == dim) l.C = shape[d];
    if (d > dim) l.inner *= shape[d];
  }
  return l;
}

}  // namespace

void CpuBackend::softmax_forward(const Tensor& out, const Tensor& x, std::int64_t dim, bool log) const {
  const Tensor xc = compute_operand(x);
  const Tensor y = compute_result(out, xc.dtype());
  const Layout l = layout_of(xc.shape(), dim);
  if (runs_kernels()) {
    dispatch_compute(log ? "log_softmax" : "softmax", xc.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (log) {
        cpu::log_softmax_forward<T>(y.data<T>(), xc.data<T>(), l.outer, l.C, l.inner);
      } else {
        cpu::softmax_forward<T>(y.data<T>(), xc.data<T>(), l.outer, l.C, l.inner);
      }
    });
  }
  finish_result(out, y);
}

void CpuBackend::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out, std::int64_t dim,
                                  bool log) const {
  const Tensor g = compute_operand(dout), y = compute_operand(out);
  const Tensor dxc = compute_result(dx, y.dtype());
  const Layout l = layout_of(y.shape(), dim);
  if (runs_kernels()) {
    dispatch_compute(log ? "log_softmax_backward" : "softmax_backward", y.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (log) {
        cpu::log_softmax_backward<T>(dxc.data<T>(), g.data<T>(), y.data<T>(), l.outer, l.C, l.inner);
      } else {
        cpu::softmax_backward<T>(dxc.data<T>(), g.data<T>(), y.data<T>(), l.outer, l.C, l.inner);
      }
    });
  }
  finish_result(dx, dxc);
}

}  // namespace memtrain::cpu
