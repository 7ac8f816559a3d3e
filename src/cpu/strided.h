// Walks an N-d index space in row-major order, keeping one element offset per operand, so kernels can read
// views (transposed, sliced, broadcast with stride 0) without copying them first.
#pragma once

#include "memtrain/core/tensor.h"

#include <array>
#include <cstdint>
#include <vector>

namespace memtrain::cpu {

// f(std::array<int64_t, N> offsets, int64_t count, std::array<int64_t, N> inner_strides) is called once per
// run of the innermost dimension: element j of the run sits at offsets[k] + j * inner_strides[k].
template <std::size_t N, typename F>
void for_each_run(const Shape& shape, const std::array<const Shape*, N>& strides, F&& f) {
  const std::size_t nd = shape.size();
  for (auto s : shape)
    if (s == 0) return;
  if (nd == 0) {
    f(std::array<std::int64_t, N>{}, std::int64_t{1}, std::array<std::int64_t, N>{});
    return;
  }
  std::array<std::int64_t, N> inner{};
  for (std::size_t k = 0; k < N; ++k) inner[k] = (*strides[k])[nd - 1];
  std::vector<std::int64_t> index(nd, 0);
  std::array<std::int64_t, N> off{};
  const std::int64_t count = shape[nd - 1];
  while (true) {
    f(off, count, inner);
    // Advance the odometer over dims [0, nd-1).
    std::int64_t d = static_cast<std::int64_t>(nd) - 2;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        for (std::size_t k = 0; k < N; ++k) off[k] += (*strides[k])[d];
        break;
      }
      for (std::size_t k = 0; k < N; ++k) off[k] -= (*strides[k])[d] * (shape[d] - 1);
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Copies elements of `elem_size` bytes from a strided source view into a strided destination view.
void strided_copy(void* dst, const Shape& dst_strides, const void* src, const Shape& src_strides, const Shape& shape,
                  std::size_t elem_size);

}  // namespace memtrain::cpu
