// Embedding lookup: rows of a (V, C) table gathered by integer indices. I is int32_t or int64_t; indices
// are range-checked by the op front-end before these run.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

template <typename T, typename I>
void embedding_forward(T* out, const T* weight, const I* indices, int64_t N, int64_t C);  // out (N, C)
// dweight (V, C) += dout rows scattered by index. Split over column blocks so no two threads touch one
// element and repeated indices add up in index order (deterministic).
template <typename T, typename I>
void embedding_backward(T* dweight, const T* dout, const I* indices, int64_t N, int64_t C);

}  // namespace memtrain::cpu
