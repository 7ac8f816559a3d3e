// The CPU backend's reduction entries (src/core/backend.h: sum, max). sum accumulates in a float64 buffer
// (exact enough for any f32 input size) shaped like the kept dims; max scans each output's row, one output
// per iteration so the rows run in parallel.
#include "cpu/cpu_backend.h"
#include "cpu/map.h"
#include "cpu/strided.h"

#include <cmath>
#include <cstdint>

namespace memtrain::cpu {

void CpuBackend::sum(const Tensor& out, const Tensor& a) const {
  const Tensor x = widened(a);
  const Tensor acc = compute_result(out, DType::f64);  // out itself for a contiguous f64 out
  Tensor(acc).fill_(0.0);
  if (runs_kernels()) {
    const Shape acc_strides = broadcast_strides(acc, a.shape());
    double* o = acc.data<double>();
    dispatch_compute("sum", x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* p = x.data<T>();
      for_each_run<2>(a.shape(), {&x.strides(), &acc_strides}, [&](auto off, std::int64_t n, auto inner) {
        if (inner[1] == 0) {
          double s = 0;
          for (std::int64_t j = 0; j < n; ++j) s += static_cast<double>(p[off[0] + j * inner[0]]);
          o[off[1]] += s;
        } else {
          for (std::int64_t j = 0; j < n; ++j) o[off[1] + j * inner[1]] += static_cast<double>(p[off[0] + j * inner[0]]);
        }
      });
    });
  }
  finish_result(out, acc);
}

void CpuBackend::max(const Tensor& values, const Tensor& indices, const Tensor& a, std::int64_t dim) const {
  const Tensor x = widened(a);
  const Shape& keep = indices.shape();
  // The values are computed even for argmax (the scan keeps the best value anyway).
  const Tensor val = values.defined() ? compute_result(values, x.dtype()) : Tensor::empty(keep, x.dtype(), a.device());
  if (runs_kernels()) {
    const Shape& xs = x.strides();
    const std::int64_t n = a.shape()[static_cast<std::size_t>(dim)], step = xs[static_cast<std::size_t>(dim)];
    const std::int64_t rank = a.dim(), count = shape_numel(keep);
    std::int64_t* idx = indices.data<std::int64_t>();
    dispatch_compute("max", x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* p = x.data<T>();
      T* v = val.data<T>();
      // One output per iteration; its input offset is unravelled from the flat index (rank ops, cheap next to
      // the n-element scan), which lets the rows run in parallel.
#pragma omp parallel for if (count * n > kParallelGrain)
      for (std::int64_t i = 0; i < count; ++i) {
        std::int64_t rest = i, base = 0;
        for (std::int64_t k = rank - 1; k >= 0; --k) {
          base += (rest % keep[k]) * xs[k];
          rest /= keep[k];
        }
        T best = p[base];
        std::int64_t best_j = 0;
        for (std::int64_t j = 1; j < n && !std::isnan(best); ++j) {
          const T w = p[base + j * step];
          if (w > best || std::isnan(w)) {
            best = w;
            best_j = j;
          }
        }
        v[i] = best;
        idx[i] = best_j;
      }
    });
  }
  if (values.defined()) finish_result(values, val);
}

}  // namespace memtrain::cpu
