#include "cpu/embedding.h"

#include "core/operand_checks.h"
#include "cpu/cpu_backend.h"
#include "cpu/instantiate.h"
#include "memtrain/core/float_types.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

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

namespace {

// out (N, row_bytes) = the rows of weight picked by indices, whatever the dtype (a bf16 table, stored without an
// f32 master, is gathered as it is: no f32 copy of the table).
template <typename I>
void gather_rows(char* out, const char* weight, const I* indices, int64_t N, std::size_t row_bytes) {
#pragma omp parallel for schedule(static) if (N * static_cast<int64_t>(row_bytes) > (1 << 17))
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(out + n * static_cast<int64_t>(row_bytes), weight + static_cast<int64_t>(indices[n]) * static_cast<int64_t>(row_bytes), row_bytes);
}

// dweight (V, C) bf16 += dout rows (bf16) scattered by index: each row's occurrences are summed in f32 in
// position order, then added to the row and rounded once, so a frequent token's gradient is not rounded once
// per occurrence, and no f32 copy of the table is made. Rows are distinct per group: threads never share one.
template <typename I>
void embedding_backward_bf16(BFloat16* dweight, const BFloat16* dout, const I* indices, int64_t N, int64_t C) {
  std::vector<int64_t> order(static_cast<std::size_t>(N));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return indices[a] < indices[b]; });
  std::vector<int64_t> starts;  // where each row's group begins in `order`
  for (int64_t k = 0; k < N; ++k)
    if (k == 0 || indices[order[k]] != indices[order[k - 1]]) starts.push_back(k);
  starts.push_back(N);
  const auto groups = static_cast<int64_t>(starts.size()) - 1;
#pragma omp parallel if (N * C > (1 << 15))
  {
    std::vector<float> acc(static_cast<std::size_t>(C));
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = starts[g]; k < starts[g + 1]; ++k) {
        const BFloat16* src = dout + order[k] * C;
        for (int64_t c = 0; c < C; ++c) acc[c] += src[c].to_float();
      }
      BFloat16* dst = dweight + static_cast<int64_t>(indices[order[starts[g]]]) * C;
      for (int64_t c = 0; c < C; ++c) dst[c] = BFloat16::from_float(dst[c].to_float() + acc[c]);
    }
  }
}

}  // namespace

// ---- the CPU backend's entries ----

void CpuBackend::embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& indices) const {
  const char* op = "embedding";
  const std::int64_t V = weight.size(0), C = weight.size(1);
  const Tensor idx = indices.is_contiguous() ? indices.detach() : indices.detach().contiguous();
  if (weight.dtype() == out.dtype() && weight.dtype() == DType::bf16 && weight.is_contiguous() && out.is_contiguous()) {
    if (!runs_kernels()) return;
    ::memtrain::detail::dispatch_index(idx.dtype(), [&](auto izero) {
      using I = decltype(izero);
      ::memtrain::detail::check_index_range(op, "index", idx.data<I>(), idx.numel(), V, false, 0, indices.shape());
      gather_rows<I>(static_cast<char*>(out.data_ptr()), static_cast<const char*>(weight.data_ptr()), idx.data<I>(),
                     idx.numel(), static_cast<std::size_t>(C) * dtype_size(DType::bf16));
    });
    return;
  }
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
  const Tensor idx = indices.is_contiguous() ? indices.detach() : indices.detach().contiguous();
  if (dweight.dtype() == DType::bf16 && dout.dtype() == DType::bf16 && dweight.is_contiguous()) {
    const Tensor g = dout.is_contiguous() ? dout.detach() : dout.detach().contiguous();
    if (!accumulate) fill(dweight, 0.0);
    if (!runs_kernels()) return;
    ::memtrain::detail::dispatch_index(idx.dtype(), [&](auto izero) {
      using I = decltype(izero);
      embedding_backward_bf16<I>(static_cast<BFloat16*>(dweight.data_ptr()), static_cast<const BFloat16*>(g.data_ptr()),
                                 idx.data<I>(), idx.numel(), dweight.size(1));
    });
    return;
  }
  const Tensor g = compute_operand(dout);
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
