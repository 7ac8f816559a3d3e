// CUDA backend, host side of cuda/elementwise.h: argument checks, merging the layout down to the
// fewest dims, and the dispatch to the launchers in kernels/elementwise_broadcast.cuh.
//
// Every entry point checks its arguments first (so a bad call throws without touching a device), then
// requires the device, makes it current and enqueues on its current stream (cuda/stream.h).
// Merging: size-1 dims are dropped and a dim joins its outer neighbour when every input continues the
// neighbour's run (outer stride == size * stride; the output is contiguous, so it always does). A plain
// contiguous op becomes one dim, a bias add [N, C] + [C] two. Layouts still deeper than the kernel's 8 dims
// are looped here over the outermost dims, one launch per index.
#include "cuda/elementwise.h"

#include "cuda/cuda_backend_entries.h"
#include "cuda/cuda_common.h"
#include "memtrain/core/error.h"
#include "cuda/nn.h"
#include "kernels/elementwise_broadcast.cuh"

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

namespace memtrain::cuda {

namespace {

using detail::launch_stream;

template <int K>
struct Dim {
  std::int64_t size;
  std::array<std::int64_t, K> stride;  // per input, in elements
};

// The operands of one call: K inputs with their element sizes, the output's element size.
template <int K>
struct Operands {
  std::array<const char*, K> in;
  std::array<const std::int64_t*, K> strides;
  std::array<std::size_t, K> in_size;
  std::size_t out_size;
};

template <int K>
std::vector<Dim<K>> merge(const std::vector<Dim<K>>& dims) {
  std::vector<Dim<K>> out;
  for (const Dim<K>& d : dims) {
    if (d.size == 1) continue;
    bool joins = !out.empty();
    for (int k = 0; k < K && joins; ++k) joins = out.back().stride[k] == d.size * d.stride[k];
    if (joins) {
      out.back() = Dim<K>{out.back().size * d.size, d.stride};
    } else {
      out.push_back(d);
    }
  }
  if (out.empty()) out.push_back(Dim<K>{1, {}});  // rank 0 or all-ones: one element, every stride 0
  return out;
}

// Enqueues the merged layout `dims[0, ndim)`; launch(out, inputs, layout, n) enqueues one kernel.
template <int K, typename Launch>
void enqueue(const char* op, char* out, std::array<const char*, K> in, const Operands<K>& ops, const Dim<K>* dims,
             int ndim, Launch& launch) {
  if (ndim > kElementwiseMaxDims) {
    std::int64_t inner = 1;
    for (int d = 1; d < ndim; ++d) inner *= dims[d].size;
    for (std::int64_t i = 0; i < dims[0].size; ++i) {
      std::array<const char*, K> next;
      for (int k = 0; k < K; ++k) {
        next[k] = in[k] + i * dims[0].stride[k] * static_cast<std::int64_t>(ops.in_size[k]);
      }
      enqueue<K>(op, out + i * inner * static_cast<std::int64_t>(ops.out_size), next, ops, dims + 1, ndim - 1,
                 launch);
    }
    return;
  }
  ElementwiseLayout<K> layout;
  layout.ndim = ndim;
  std::uint64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    layout.shape[d] = dims[d].size;
    for (int k = 0; k < K; ++k) layout.strides[k][d] = dims[d].stride[k];
    n *= static_cast<std::uint64_t>(dims[d].size);
  }
  detail::check_cuda(launch(out, in, layout, n), op, "kernel launch");
}

// Checks the layout (throws naming `op`), then runs launch over it on `device`. Nothing for 0 elements.
template <int K, typename Launch>
void run(const char* op, void* out, const Operands<K>& ops, const std::int64_t* shape, int ndim, int device,
         Launch launch) {
  MT_CHECK(ndim >= 0, op, "negative rank {}", ndim);
  bool have_strides = true;
  for (int k = 0; k < K; ++k) have_strides = have_strides && ops.strides[k] != nullptr;
  MT_CHECK(ndim == 0 || (shape != nullptr && have_strides), op, "null shape or strides for rank {}", ndim);
  std::vector<Dim<K>> dims(static_cast<std::size_t>(ndim));
  bool empty = false;
  for (int d = 0; d < ndim; ++d) {
    MT_CHECK(shape[d] >= 0, op, "negative extent {} in dim {}", shape[d], d);
    dims[static_cast<std::size_t>(d)].size = shape[d];
    for (int k = 0; k < K; ++k) dims[static_cast<std::size_t>(d)].stride[k] = ops.strides[k][d];
    empty = empty || shape[d] == 0;
  }
  if (empty) return;
  bool have_inputs = out != nullptr;
  for (int k = 0; k < K; ++k) have_inputs = have_inputs && ops.in[k] != nullptr;
  MT_CHECK(have_inputs, op, "null pointer");
  // The element count and every input's byte offsets (extent * |stride| summed over dims) fit in int64.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t n = 1;
  std::array<std::int64_t, K> reach{};
  for (int d = 0; d < ndim; ++d) {
    const Dim<K>& x = dims[static_cast<std::size_t>(d)];
    bool fits = n <= kMax / x.size;
    for (int k = 0; k < K && fits; ++k) {
      const std::int64_t s = x.stride[k];
      const std::int64_t a = s < 0 ? -s : s;
      const auto es = static_cast<std::int64_t>(ops.in_size[k]);
      fits = s != std::numeric_limits<std::int64_t>::min() && (a == 0 || x.size <= kMax / a / es) &&
             reach[k] <= kMax - x.size * a * es;
      if (fits) reach[k] += x.size * a * es;
    }
    MT_CHECK(fits, op, "extent {} with strides of dim {} overflows 64-bit offsets", x.size, d);
    n *= x.size;
  }
  MT_CHECK(n <= kMax / static_cast<std::int64_t>(ops.out_size), op, "{} output elements overflow 64-bit offsets", n);

  const std::vector<Dim<K>> merged = merge<K>(dims);
  detail::require_device(op, device);
  detail::DeviceGuard guard(device, op);
  enqueue<K>(op, static_cast<char*>(out), ops.in, ops, merged.data(), static_cast<int>(merged.size()), launch);
}

EwFormat float_format(const char* op, DType dtype) {
  switch (dtype) {
    case DType::f32: return EwFormat::f32;
    case DType::f64: return EwFormat::f64;
    case DType::f16: return EwFormat::f16;
    case DType::bf16: return EwFormat::bf16;
    default: break;
  }
  ::memtrain::detail::throw_error(op, fmt::format("dtype {} is not supported on CUDA (f32, f64, f16, bf16)",
                                                  dtype_name(dtype)));
}

EwCompareType compare_type(const char* op, DType dtype) {
  switch (dtype) {
    case DType::f32: return EwCompareType::f32;
    case DType::f64: return EwCompareType::f64;
    case DType::f16: return EwCompareType::f16;
    case DType::bf16: return EwCompareType::bf16;
    case DType::i8: return EwCompareType::i8;
    case DType::u8: return EwCompareType::u8;
    case DType::i32: return EwCompareType::i32;
    case DType::i64: return EwCompareType::i64;
    case DType::boolean: return EwCompareType::boolean;
    default: break;
  }
  ::memtrain::detail::throw_error(
      op, fmt::format("dtype {} is not supported on CUDA (f32, f64, f16, bf16, i8, u8, i32, i64, bool)",
                      dtype_name(dtype)));
}

// The host and the kernels share one list of maps (memtrain/core/elementwise_ops.h); what is left to check
// is a value that came through an int and names none of them.
EwUnary to_kernel(UnaryOp op) {
  if (static_cast<int>(op) < 0 || op > elementwise::kLastUnaryOp) {
    ::memtrain::detail::throw_error("cuda::elementwise_unary", fmt::format("unknown op {}", static_cast<int>(op)));
  }
  return op;
}

EwBinary to_kernel(BinaryOp op) {
  if (static_cast<int>(op) < 0 || op > elementwise::kLastBinaryOp) {
    ::memtrain::detail::throw_error("cuda::elementwise_binary", fmt::format("unknown op {}", static_cast<int>(op)));
  }
  return op;
}

}  // namespace

void elementwise_unary(UnaryOp op, void* out, const void* x, const std::int64_t* x_strides,
                       const std::int64_t* shape, int ndim, DType dtype, double p0, double p1, int device) {
  constexpr const char* kOp = "cuda::elementwise_unary";
  const EwFormat format = float_format(kOp, dtype);
  const EwUnary kop = to_kernel(op);
  const std::size_t es = dtype_size(dtype);
  const Operands<1> ops{{static_cast<const char*>(x)}, {x_strides}, {es}, es};
  run<1>(kOp, out, ops, shape, ndim, device,
         [&](char* o, std::array<const char*, 1> in, const ElementwiseLayout<1>& layout, std::uint64_t n) {
           return launch_elementwise_unary(kop, format, o, in[0], layout, n, p0, p1, launch_stream());
         });
}

void elementwise_binary(BinaryOp op, void* out, const void* a, const std::int64_t* a_strides, const void* b,
                        const std::int64_t* b_strides, const std::int64_t* shape, int ndim, DType dtype, double p0,
                        double p1, int device) {
  constexpr const char* kOp = "cuda::elementwise_binary";
  const EwFormat format = float_format(kOp, dtype);
  const EwBinary kop = to_kernel(op);
  const std::size_t es = dtype_size(dtype);
  const Operands<2> ops{{static_cast<const char*>(a), static_cast<const char*>(b)}, {a_strides, b_strides}, {es, es},
                        es};
  run<2>(kOp, out, ops, shape, ndim, device,
         [&](char* o, std::array<const char*, 2> in, const ElementwiseLayout<2>& layout, std::uint64_t n) {
           return launch_elementwise_binary(kop, format, o, in[0], in[1], layout, n, p0, p1, launch_stream());
         });
}

void where(void* out, const void* cond, const std::int64_t* cond_strides, const void* a, const std::int64_t* a_strides,
           const void* b, const std::int64_t* b_strides, const std::int64_t* shape, int ndim, std::size_t elem_size,
           int device) {
  constexpr const char* kOp = "cuda::where";
  MT_CHECK(elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8, kOp,
           "element size {} is not supported (1, 2, 4 or 8 bytes)", elem_size);
  const Operands<3> ops{{static_cast<const char*>(cond), static_cast<const char*>(a), static_cast<const char*>(b)},
                        {cond_strides, a_strides, b_strides},
                        {1, elem_size, elem_size},
                        elem_size};
  run<3>(kOp, out, ops, shape, ndim, device,
         [&](char* o, std::array<const char*, 3> in, const ElementwiseLayout<3>& layout, std::uint64_t n) {
           return launch_elementwise_where(o, reinterpret_cast<const std::uint8_t*>(in[0]), in[1], in[2], layout, n,
                                           elem_size, launch_stream());
         });
}

void compare_scalar(CompareOp op, void* out, const void* x, const std::int64_t* x_strides, const std::int64_t* shape,
                    int ndim, DType dtype, double s, int device) {
  constexpr const char* kOp = "cuda::compare_scalar";
  MT_CHECK(dtype != DType::boolean, kOp, "needs a numeric dtype, got bool");
  const EwCompareType type = compare_type(kOp, dtype);
  MT_CHECK(op == CompareOp::gt || op == CompareOp::lt, kOp, "unknown op {}", static_cast<int>(op));
  const EwCompare kop = op == CompareOp::gt ? EwCompare::gt : EwCompare::lt;
  const Operands<1> ops{{static_cast<const char*>(x)}, {x_strides}, {dtype_size(dtype)}, 1};
  run<1>(kOp, out, ops, shape, ndim, device,
         [&](char* o, std::array<const char*, 1> in, const ElementwiseLayout<1>& layout, std::uint64_t n) {
           return launch_elementwise_compare_scalar(kop, type, reinterpret_cast<std::uint8_t*>(o), in[0], layout, n,
                                                    s, launch_stream());
         });
}

void eq(void* out, const void* a, const std::int64_t* a_strides, const void* b, const std::int64_t* b_strides,
        const std::int64_t* shape, int ndim, DType dtype, int device) {
  constexpr const char* kOp = "cuda::eq";
  const EwCompareType type = compare_type(kOp, dtype);
  const std::size_t es = dtype_size(dtype);
  const Operands<2> ops{{static_cast<const char*>(a), static_cast<const char*>(b)}, {a_strides, b_strides}, {es, es},
                        1};
  run<2>(kOp, out, ops, shape, ndim, device,
         [&](char* o, std::array<const char*, 2> in, const ElementwiseLayout<2>& layout, std::uint64_t n) {
           return launch_elementwise_eq(type, reinterpret_cast<std::uint8_t*>(o), in[0], in[1], layout, n,
                                        launch_stream());
         });
}

}  // namespace memtrain::cuda

// ---- the CUDA backend's elementwise entries (src/core/backend.h) ----

namespace memtrain::cuda {

namespace {

using CoreUnary = ::memtrain::detail::Backend::UnaryOp;
using CoreBinary = ::memtrain::detail::Backend::BinaryOp;

// The contract's op enums list the kernels' ops in the same order (cuda/elementwise.h is public
// and cannot name the backend's header), so an op converts by value.
static_assert(static_cast<int>(CoreUnary::clamp) == static_cast<int>(UnaryOp::clamp) &&
              static_cast<int>(CoreUnary::gelu_tanh) == static_cast<int>(UnaryOp::gelu_tanh) &&
              static_cast<int>(CoreUnary::add_scalar) == static_cast<int>(UnaryOp::add_scalar));
static_assert(static_cast<int>(CoreBinary::silu_backward) == static_cast<int>(BinaryOp::silu_backward) &&
              static_cast<int>(CoreBinary::gelu_tanh_backward) == static_cast<int>(BinaryOp::gelu_tanh_backward) &&
              static_cast<int>(CoreBinary::add) == static_cast<int>(BinaryOp::add));

// The kernels take f32, f64, f16 and bf16 as stored; other float dtypes (fp8) are widened to f32 on the
// device and the result rounded back, which is what the CPU computes too.
bool native_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

// The fused gelu kernels of cuda/nn.h take contiguous f32, bf16 or f16.
bool gelu_fused(const Tensor& t) {
  return (t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16) && t.is_contiguous();
}

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const std::size_t n = shape.size(), r = static_cast<std::size_t>(t.dim());
  Shape strides(n, 0);
  for (std::size_t i = 0; i < r; ++i) strides[n - r + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return strides;
}

// Operands of a comparison: f32/f64/f16/bf16, integers and bool as stored; fp8 widened to f32 first
// (exact, as on the CPU).
Tensor comparable(const Tensor& t) {
  return is_floating(t.dtype()) && !native_float(t.dtype()) ? t.detach().to(DType::f32) : t.detach();
}

// Where a kernel writes `out`: out itself when contiguous in a native dtype, else a contiguous buffer in
// `dtype` that finish() copies into out.
Tensor kernel_result(const Tensor& out, DType dtype) {
  return out.is_contiguous() && out.dtype() == dtype ? out : Tensor::empty(out.shape(), dtype, out.device());
}
void finish(const Tensor& out, const Tensor& computed) {
  if (computed.data_ptr() != out.data_ptr()) Tensor(out).copy_(computed);
}

}  // namespace

void CudaBackend::unary(const Tensor& out, const Tensor& a, CoreUnary op, double p0, double p1) const {
  const DType dtype = native_float(a.dtype()) ? a.dtype() : DType::f32;
  const Tensor x = dtype == a.dtype() ? a.detach() : a.detach().to(dtype);
  const Tensor y = kernel_result(out, dtype);
  if (op == CoreUnary::gelu_tanh && gelu_fused(x)) {
    gelu_tanh_forward(y.data_ptr(), x.data_ptr(), dtype, static_cast<std::size_t>(x.numel()), x.device().index);
  } else {
    elementwise_unary(static_cast<cuda::UnaryOp>(op), y.data_ptr(), x.data_ptr(), x.strides().data(), x.shape().data(),
                      static_cast<int>(x.dim()), dtype, p0, p1, x.device().index);
  }
  finish(out, y);
}

void CudaBackend::binary(const Tensor& out, const Tensor& a, const Tensor& b, CoreBinary op, double p0,
                         double p1) const {
  const Shape& shape = out.shape();
  const DType dtype = native_float(a.dtype()) ? a.dtype() : DType::f32;
  const Tensor x = dtype == a.dtype() ? a.detach() : a.detach().to(dtype);
  const Tensor z = dtype == b.dtype() ? b.detach() : b.detach().to(dtype);
  const Tensor y = kernel_result(out, dtype);
  if (op == CoreBinary::gelu_tanh_backward && x.shape() == shape && z.shape() == shape && gelu_fused(x) &&
      gelu_fused(z)) {
    gelu_tanh_backward(y.data_ptr(), x.data_ptr(), z.data_ptr(), dtype, static_cast<std::size_t>(z.numel()),
                       z.device().index);
  } else {
    const Shape xs = broadcast_strides(x, shape), zs = broadcast_strides(z, shape);
    elementwise_binary(static_cast<cuda::BinaryOp>(op), y.data_ptr(), x.data_ptr(), xs.data(), z.data_ptr(), zs.data(),
                       shape.data(), static_cast<int>(shape.size()), dtype, p0, p1, x.device().index);
  }
  finish(out, y);
}

void CudaBackend::where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) const {
  const Shape& shape = out.shape();
  const Shape cs = broadcast_strides(cond, shape), as = broadcast_strides(a, shape), bs = broadcast_strides(b, shape);
  cuda::where(out.data_ptr(), cond.data_ptr(), cs.data(), a.data_ptr(), as.data(), b.data_ptr(), bs.data(),
              shape.data(), static_cast<int>(shape.size()), a.element_size(), a.device().index);
}

void CudaBackend::compare_scalar(const Tensor& out, const Tensor& a, CompareOp op, double s) const {
  const Tensor x = comparable(a);
  cuda::compare_scalar(op == CompareOp::gt ? cuda::CompareOp::gt : cuda::CompareOp::lt, out.data_ptr(), x.data_ptr(),
                       x.strides().data(), x.shape().data(), static_cast<int>(x.dim()), x.dtype(), s,
                       x.device().index);
}

void CudaBackend::eq(const Tensor& out, const Tensor& a, const Tensor& b) const {
  const Shape& shape = out.shape();
  const Tensor x = comparable(a), z = comparable(b);
  const Shape xs = broadcast_strides(x, shape), zs = broadcast_strides(z, shape);
  cuda::eq(out.data_ptr(), x.data_ptr(), xs.data(), z.data_ptr(), zs.data(), shape.data(),
           static_cast<int>(shape.size()), x.dtype(), a.device().index);
}

}  // namespace memtrain::cuda
