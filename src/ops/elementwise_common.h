// Front-end scaffolding shared by the elementwise ops: run a CPU map in the compute dtype and give the
// result back in the input's dtype.
#pragma once

#include "cpu/convert.h"
#include "cpu/map.h"
#include "ops/op_utils.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace memtrain::ops::detail {

// Contiguous bf16/f16 arrays of n elements through an f32 array kernel in blocks widened on the stack, so a
// narrow activation never gets a full-size f32 copy (mixed precision stores activations narrow to halve them;
// f32 temporaries of their size would give the saving back at the forward's peak). kernel(out, in..., len)
// runs on f32 blocks; each result is rounded once, as widening the whole array would give.
constexpr std::int64_t kNarrowBlock = 2048;

template <std::size_t kInputs, typename Kernel>
void narrow_blocks(DType dtype, std::int64_t n, void* out, const std::array<const void*, kInputs>& in, Kernel kernel) {
  const std::size_t es = dtype_size(dtype);
  const std::int64_t blocks = (n + kNarrowBlock - 1) / kNarrowBlock;
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::array<std::array<float, kNarrowBlock>, kInputs + 1> buf;
    const std::int64_t off = b * kNarrowBlock, len = std::min(kNarrowBlock, n - off);
    for (std::size_t i = 0; i < kInputs; ++i)
      cpu::convert(static_cast<const unsigned char*>(in[i]) + off * es, dtype, buf[i + 1].data(), DType::f32,
                   static_cast<std::size_t>(len));
    if constexpr (kInputs == 1) kernel(buf[0].data(), buf[1].data(), len);
    else kernel(buf[0].data(), buf[1].data(), buf[2].data(), len);
    cpu::convert(buf[0].data(), DType::f32, static_cast<unsigned char*>(out) + off * es, dtype,
                 static_cast<std::size_t>(len));
  }
}

inline bool is_narrow_contiguous(const Tensor& t) {
  return (t.dtype() == DType::bf16 || t.dtype() == DType::f16) && t.is_contiguous();
}

// y = f(x) elementwise; f is a generic lambda called with float or double. Not recorded by autograd.
template <typename F>
Tensor unary_kernel(const char* op, const Tensor& a, F f) {
  check_floating(op, a);
  check_cpu(op, a);
  if (is_narrow_contiguous(a)) {
    Tensor y = Tensor::empty(a.shape(), a.dtype());
    narrow_blocks<1>(a.dtype(), a.numel(), y.data_ptr(), {a.data_ptr()},
                     [&](float* out, const float* x, std::int64_t len) {
                       for (std::int64_t i = 0; i < len; ++i) out[i] = static_cast<float>(f(x[i]));
                     });
    return y;
  }
  const Tensor x = to_compute(a);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  dispatch_compute(op, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::map_unary<T>(x, y, [&](T v) { return static_cast<T>(f(v)); });
  });
  return y.dtype() == a.dtype() ? y : y.to(a.dtype());
}

// out = f(a, b) with broadcasting; a, b same dtype (checked). Not recorded by autograd.
template <typename F>
Tensor binary_kernel(const char* op, const Tensor& a, const Tensor& b, F f) {
  check_same(op, a, b);
  check_floating(op, a);
  check_cpu(op, a);
  const Shape shape = broadcast_shapes(op, a.shape(), b.shape());
  if (is_narrow_contiguous(a) && is_narrow_contiguous(b) && a.shape() == shape && b.shape() == shape) {
    Tensor out = Tensor::empty(shape, a.dtype());
    narrow_blocks<2>(a.dtype(), out.numel(), out.data_ptr(), {a.data_ptr(), b.data_ptr()},
                     [&](float* o, const float* x, const float* z, std::int64_t len) {
                       for (std::int64_t i = 0; i < len; ++i) o[i] = static_cast<float>(f(x[i], z[i]));
                     });
    return out;
  }
  const Tensor x = to_compute(a), z = to_compute(b);
  Tensor out = Tensor::empty(shape, x.dtype());
  dispatch_compute(op, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cpu::map_binary<T>(x.data<T>(), broadcast_strides(x, shape), z.data<T>(), broadcast_strides(z, shape),
                       out.data<T>(), shape, [&](T p, T q) { return static_cast<T>(f(p, q)); });
  });
  return out.dtype() == a.dtype() ? out : out.to(a.dtype());
}

}  // namespace memtrain::ops::detail
