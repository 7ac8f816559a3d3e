// Copies between a file and a tensor that is not a contiguous CPU tensor (a device tensor, a strided view,
// another dtype) go piece by piece through one bounded host buffer, so a save or a load never makes a whole
// host copy of a tensor.
#pragma once

#include "core/backend.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/tensor.h"

#include <algorithm>
#include <cstdint>

namespace memtrain::io {

// Whether t's bytes are one run of host memory, which a file can be read into or written from directly.
inline bool contiguous_in_host_memory(const Tensor& t) {
  return t.is_contiguous() && ::memtrain::detail::backend_for(t.device()).host_addressable();
}

// Calls f(piece, first) for the elements of t in pieces of at most max_elements, in element order: piece is a
// view of t's storage (no autograd) and first the element index at which it starts. A contiguous tensor is cut
// anywhere; another is cut between rows of dimension 0, so a piece holds at least one row.
template <typename F>
void for_each_piece(const Tensor& t, std::int64_t max_elements, F f) {
  const std::int64_t numel = t.numel();
  if (numel == 0) return;
  max_elements = std::max<std::int64_t>(max_elements, 1);
  if (t.is_contiguous()) {
    for (std::int64_t first = 0; first < numel; first += max_elements) {
      const std::int64_t n = std::min(max_elements, numel - first);
      f(Tensor::make_view(t.storage(), {n}, {1}, t.offset() + first, t.dtype()), first);
    }
    return;
  }
  const std::int64_t rows = t.size(0), row = numel / rows;
  const std::int64_t rows_per_piece = std::max<std::int64_t>(1, max_elements / row);
  for (std::int64_t r = 0; r < rows; r += rows_per_piece) {
    Shape shape = t.shape();
    shape[0] = std::min(rows_per_piece, rows - r);
    f(Tensor::make_view(t.storage(), shape, t.strides(), t.offset() + r * t.stride(0), t.dtype()), r * row);
  }
}

// The host buffer the pieces pass through: one per save or load, grown to the largest piece and accounted as
// workspace.
class StagingBuffer {
 public:
  // A contiguous CPU tensor of `shape` and `dtype` over the buffer, valid until the next call.
  Tensor view(const Shape& shape, DType dtype) {
    const auto bytes = static_cast<std::int64_t>(shape_numel(shape) * static_cast<std::int64_t>(dtype_size(dtype)));
    if (!bytes_.defined() || bytes_.numel() < bytes) {
      bytes_ = Tensor();  // the old buffer goes before the larger one comes
      CategoryGuard category(MemoryCategory::workspace);
      bytes_ = Tensor::empty({std::max<std::int64_t>(bytes, 1)}, DType::u8);
    }
    return Tensor::make_view(bytes_.storage(), shape, contiguous_strides(shape), 0, dtype);
  }

 private:
  Tensor bytes_;
};

}  // namespace memtrain::io
