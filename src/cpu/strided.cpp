#include "cpu/strided.h"

#include <cstring>

namespace memtrain::cpu {

namespace {
template <typename T>
void copy_typed(T* dst, const Shape& dst_strides, const T* src, const Shape& src_strides, const Shape& shape) {
  for_each_run<2>(shape, {&dst_strides, &src_strides}, [&](auto off, std::int64_t n, auto inner) {
    T* d = dst + off[0];
    const T* s = src + off[1];
    if (inner[0] == 1 && inner[1] == 1) {
      std::memcpy(d, s, static_cast<std::size_t>(n) * sizeof(T));
    } else {
      for (std::int64_t j = 0; j < n; ++j) d[j * inner[0]] = s[j * inner[1]];
    }
  });
}
}  // namespace

void strided_copy(void* dst, const Shape& dst_strides, const void* src, const Shape& src_strides, const Shape& shape,
                  std::size_t elem_size) {
  switch (elem_size) {
    case 1: return copy_typed(static_cast<std::uint8_t*>(dst), dst_strides, static_cast<const std::uint8_t*>(src), src_strides, shape);
    case 2: return copy_typed(static_cast<std::uint16_t*>(dst), dst_strides, static_cast<const std::uint16_t*>(src), src_strides, shape);
    case 4: return copy_typed(static_cast<std::uint32_t*>(dst), dst_strides, static_cast<const std::uint32_t*>(src), src_strides, shape);
    case 8: return copy_typed(static_cast<std::uint64_t*>(dst), dst_strides, static_cast<const std::uint64_t*>(src), src_strides, shape);
    default: MT_CHECK(false, "strided_copy", "unsupported element size {}", elem_size);
  }
}

}  // namespace memtrain::cpu
