// Front-end scaffolding shared by the elementwise ops: run a CPU map in the compute dtype and give the
// result back in the input's dtype, or, for tensors on a CUDA device, the matching kernel of
// memtrain/cuda/elementwise.h (named by the op's CudaUnary / CudaBinary, since a lambda cannot run there).
#pragma once

#include "cpu/convert.h"
#include "cpu/map.h"
#include "memtrain/cuda/elementwise.h"
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

// ---- the CUDA branch ----

// The CUDA kernel of an elementwise op and its scalar parameters (see memtrain/cuda/elementwise.h).
struct CudaUnary {
  cuda::UnaryOp op;
  double p0 = 0.0, p1 = 0.0;
};
struct CudaBinary {
  cuda::BinaryOp op;
  double p0 = 0.0, p1 = 0.0;
};

// The kernels take f32, f64, f16 and bf16 as stored; other float dtypes (fp8) are widened to f32 on the
// device and the result rounded back, which is what the CPU path computes too.
inline bool cuda_native_float(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

// y = op(a) on a's device, in a's dtype; a is read in place whatever its strides.
inline Tensor cuda_unary(const Tensor& a, const CudaUnary& k) {
  if (!cuda_native_float(a.dtype())) return cuda_unary(a.detach().to(DType::f32), k).to(a.dtype());
  Tensor y = Tensor::empty(a.shape(), a.dtype(), a.device());
  cuda::elementwise_unary(k.op, y.data_ptr(), a.data_ptr(), a.strides().data(), a.shape().data(),
                          static_cast<int>(a.dim()), a.dtype(), k.p0, k.p1, a.device().index);
  return y;
}

// out = op(a, b) broadcast to `shape`, on a's device (b's is checked equal by the caller), in a's dtype.
inline Tensor cuda_binary(const Tensor& a, const Tensor& b, const Shape& shape, const CudaBinary& k) {
  if (!cuda_native_float(a.dtype())) {
    return cuda_binary(a.detach().to(DType::f32), b.detach().to(DType::f32), shape, k).to(a.dtype());
  }
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  const Shape as = broadcast_strides(a, shape), bs = broadcast_strides(b, shape);
  cuda::elementwise_binary(k.op, out.data_ptr(), a.data_ptr(), as.data(), b.data_ptr(), bs.data(), shape.data(),
                           static_cast<int>(shape.size()), a.dtype(), k.p0, k.p1, a.device().index);
  return out;
}

// ---- front-ends: CPU map or CUDA kernel ----

// y = f(x) elementwise; f is a generic lambda called with float or double (the CPU path), `device_op` its
// CUDA kernel. Not recorded by autograd.
template <typename F>
Tensor unary_kernel(const char* op, const Tensor& a, const CudaUnary& device_op, F f) {
  check_floating(op, a);
  if (a.device().is_cuda()) return cuda_unary(a, device_op);
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

// out = f(a, b) with broadcasting; a, b same dtype and device (checked). Not recorded by autograd.
template <typename F>
Tensor binary_kernel(const char* op, const Tensor& a, const Tensor& b, const CudaBinary& device_op, F f) {
  check_same(op, a, b);
  check_floating(op, a);
  const Shape shape = broadcast_shapes(op, a.shape(), b.shape());
  if (a.device().is_cuda()) return cuda_binary(a, b, shape, device_op);
  check_cpu(op, a);
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
