#include "cpu/embedding.h"

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
MEMTRAIN_INSTANTIATE(float, int32_t)
MEMTRAIN_INSTANTIATE(float, int64_t)
MEMTRAIN_INSTANTIATE(double, int32_t)
MEMTRAIN_INSTANTIATE(double, int64_t)
#undef MEMTRAIN_INSTANTIATE

}  // namespace memtrain::cpu
