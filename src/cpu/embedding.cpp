#include "cpu/embedding.h"

#include "core/operand_checks.h"
#include "cpu/cpu_backend.h"
#include "cpu/instantiate.h"

#include <algorithm>
#include <cstring>

namespace memtrain::cpu {

template <typename T, typename I>
void embedding_forward(T* out, const T* weight, const I* indices, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(out + n * C, weight + static_cast<int64_t>(indices[n]) * C, sizeof(T) * static_cast<size_t>(C));
  }
}

template <typename T, typename I>
void embedding_backward(T* dweight, const T* dout, const I* indices, int64_t N, int64_t C) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (N * C > (1 << 15))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t n = 0; n < N; ++n) {
      T* dst = dweight + static_cast<int64_t>(indices[n]) * C;
      const T* src = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

#define MEMTRAIN_INSTANTIATE(T, I)                                                        \
  template void embedding_forward<T, I>(T*, const T*, const I*, int64_t, int64_t);        \
  template void embedding_backward<T, I>(T*, const T*, const I*, int64_t, int64_t);
MEMTRAIN_CPU_FOR_COMPUTE_AND_INDEX_TYPES(MEMTRAIN_INSTANTIATE)
#undef MEMTRAIN_INSTANTIATE

// ---- the CPU backend's entries ----

void CpuBackend::embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& indices) const {
  const char* op = "embedding";
  const std::int64_t V = weight.size(0), C = weight.size(1);
  const Tensor idx = indices.is_contiguous() ? indices.detach() : indices.detach().contiguous();
  const Tensor wc = compute_operand(weight);
  const Tensor y = compute_result(out, wc.dtype());
  if (runs_kernels()) {
    ::memtrain::detail::dispatch_index(idx.dtype(), [&](auto izero) {
      using I = decltype(izero);
      ::memtrain::detail::check_index_range(op, "index", idx.data<I>(), idx.numel(), V, false, 0, indices.shape());
      dispatch_compute(op, wc.dtype(), [&](auto zero) {
        using T = decltype(zero);
        cpu::embedding_forward<T, I>(y.data<T>(), wc.data<T>(), idx.data<I>(), idx.numel(), C);
      });
    });
  }
  finish_result(out, y);
}

void CpuBackend::embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& indices,
                                    bool accumulate) const {
  const Tensor g = compute_operand(dout);
  const Tensor idx = indices.is_contiguous() ? indices.detach() : indices.detach().contiguous();
  const Tensor dw = compute_result(dweight, g.dtype());
  // The kernel adds into dw: it starts from dweight's values (accumulate) or from zero.
  if (!accumulate) fill(dw, 0.0);
  else if (!dw.shares_storage_with(dweight)) copy(dw, dweight);
  if (runs_kernels()) {
    dispatch_compute("embedding_backward", g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      ::memtrain::detail::dispatch_index(idx.dtype(), [&](auto izero) {
        using I = decltype(izero);
        cpu::embedding_backward<T, I>(dw.data<T>(), g.data<T>(), idx.data<I>(), idx.numel(), dweight.size(1));
      });
    });
  }
  finish_result(dweight, dw);
}

}  // namespace memtrain::cpu
