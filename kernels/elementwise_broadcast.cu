// Broadcasting elementwise kernels: unary and binary float maps, where, comparisons.
//
// Algorithm: one grid-stride loop over the flat index i of the contiguous output (64-bit loop counter).
// For each i the input offsets are computed from the layout (row-major digits of i, innermost dim first:
// one division per merged dim past the first), so any broadcast or strided view is read in place. The
// index math runs in 32 bits when n fits (I = uint32_t) since 64-bit division is several times slower.
// The op is a kernel argument switched on per element: the branch is uniform across the grid (no
// divergence) and keeps one kernel per (type, index width) instead of one per op.
// Thread mapping: global thread t handles outputs t, t + G, t + 2G, ... (G = threads in the grid), so a
// warp writes 32 consecutive outputs (coalesced); the grid is capped (kMaxBlocks) and the loop covers the
// rest. Precision: f16/bf16/f32 compute in f32, f64 in f64, rounded once to the output (nearest even);
// libm-accurate device functions (no fast-math intrinsics), so results are within a few f32 ulps of the
// CPU's.
// Aliasing: out may be an input read with the identical contiguous layout (in-place ops): each thread
// reads its element before writing it. No __restrict__ for that reason.
#include "elementwise_broadcast.cuh"

#include "device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace memtrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::uint64_t kMaxBlocks = 8192;  // ~2M threads: several waves on any current GPU

unsigned grid_for(std::uint64_t n) {
  const std::uint64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::uint64_t>(blocks, 1, kMaxBlocks));
}

template <typename T>
struct Tag {
  using type = T;
};

// ---- loads and stores: storage type <-> compute type ----

template <typename T>
struct ComputeOf {
  using type = float;
};
template <>
struct ComputeOf<double> {
  using type = double;
};
template <typename T>
using compute_t = typename ComputeOf<T>::type;

// f64 stays f64; the other formats go through f32 (device_math.cuh).
__device__ __forceinline__ double load(double x) { return x; }
template <typename T>
__device__ __forceinline__ float load(T x) {
  return device::to_f32(x);
}

template <typename T>
__device__ __forceinline__ T store(compute_t<T> x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return device::from_f32<T>(x);
  }
}

// ---- math in the compute type (explicit f/non-f names: no reliance on overload resolution) ----

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_pow(float x, float e) { return powf(x, e); }
__device__ __forceinline__ double m_pow(double x, double e) { return pow(x, e); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }

template <typename C>
__device__ __forceinline__ C stable_sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + m_exp(-x));
  const C z = m_exp(x);
  return z / (C(1) + z);
}

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;              // GPT-2's coefficient
constexpr double kInvSqrt2 = 0.7071067811865476;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;   // 1 / sqrt(2 pi)

// f32: the CPU's form s = sigmoid(2u) = 0.5 (1 + tanh u) (cpu/gelu.cpp); f64: std::tanh, as the CPU.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k0 = static_cast<float>(kSqrt2OverPi), k1 = static_cast<float>(kGeluCubic);
  const float u = k0 * (x + k1 * x * x * x);
  return x * (1.0f / (1.0f + expf(-2.0f * u)));
}
__device__ __forceinline__ double gelu_tanh(double x) {
  const double u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5 * x * (1.0 + tanh(u));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float k0 = static_cast<float>(kSqrt2OverPi), k1 = static_cast<float>(kGeluCubic);
  const float x2 = x * x;
  const float u = k0 * (x + k1 * x2 * x);
  const float du = k0 * (1.0f + 3.0f * k1 * x2);
  const float s = 1.0f / (1.0f + expf(-2.0f * u));
  return s + 2.0f * x * s * (1.0f - s) * du;
}
__device__ __forceinline__ double gelu_tanh_grad(double x) {
  const double u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const double t = tanh(u);
  const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

// The op's scalars in the compute type, converted once per thread like the CPU's static_cast<T>(s).
template <typename C>
struct Params {
  C s0, s1, s0_minus_1;
  bool p0_is_two, p0_is_zero;
};
template <typename C>
__device__ __forceinline__ Params<C> make_params(double p0, double p1) {
  return Params<C>{static_cast<C>(p0), static_cast<C>(p1), static_cast<C>(p0 - 1.0), p0 == 2.0, p0 == 0.0};
}

template <typename C>
__device__ __forceinline__ C apply_unary(EwUnary op, C x, const Params<C>& p) {
  switch (op) {
    case EwUnary::add_scalar: return x + p.s0;
    case EwUnary::mul_scalar: return x * p.s0;
    case EwUnary::rdiv_scalar: return p.s0 / x;
    case EwUnary::neg: return -x;
    case EwUnary::abs: return m_abs(x);
    case EwUnary::exp: return m_exp(x);
    case EwUnary::log: return m_log(x);
    case EwUnary::sqrt: return m_sqrt(x);
    case EwUnary::rsqrt: return C(1) / m_sqrt(x);
    case EwUnary::pow: return p.p0_is_two ? x * x : m_pow(x, p.s0);
    case EwUnary::tanh: return m_tanh(x);
    case EwUnary::sigmoid: return stable_sigmoid(x);
    case EwUnary::relu: return x < C(0) ? C(0) : x;
    case EwUnary::gelu_erf: return C(0.5) * x * (C(1) + m_erf(x * C(kInvSqrt2)));
    case EwUnary::gelu_tanh: return gelu_tanh(x);
    case EwUnary::silu: return x * stable_sigmoid(x);
    case EwUnary::clamp: return x < p.s0 ? p.s0 : (x > p.s1 ? p.s1 : x);
  }
  return C(0) / C(0);  // unreachable: the launcher validates op
}

template <typename C>
__device__ __forceinline__ C apply_binary(EwBinary op, C a, C b, const Params<C>& p) {
  switch (op) {
    case EwBinary::add: return a + b;
    case EwBinary::sub: return a - b;
    case EwBinary::mul: return a * b;
    case EwBinary::div: return a / b;
    case EwBinary::abs_backward: return b > C(0) ? a : (b < C(0) ? -a : C(0));
    case EwBinary::pow_backward: return p.p0_is_zero ? C(0) : a * p.s0 * m_pow(b, p.s0_minus_1);
    case EwBinary::tanh_backward: return a * (C(1) - b * b);
    case EwBinary::sigmoid_backward: return a * b * (C(1) - b);
    case EwBinary::relu_backward: return b > C(0) ? a : C(0);
    case EwBinary::sqrt_backward: return a * C(0.5) / b;
    case EwBinary::rsqrt_backward: return a * C(-0.5) * b * b * b;
    case EwBinary::clamp_backward: return (b >= p.s0 && b <= p.s1) ? a : C(0);
    case EwBinary::gelu_erf_backward: {
      const C cdf = C(0.5) * (C(1) + m_erf(b * C(kInvSqrt2)));
      return a * (cdf + b * C(kInvSqrt2Pi) * m_exp(C(-0.5) * b * b));
    }
    case EwBinary::gelu_tanh_backward: return a * gelu_tanh_grad(b);
    case EwBinary::silu_backward: {
      const C s = stable_sigmoid(b);
      return a * s * (C(1) + b * (C(1) - s));
    }
  }
  return C(0) / C(0);  // unreachable: the launcher validates op
}

// ---- index math ----

// Element offsets of flat output index `flat` in each input (I wide enough for n; see the top).
template <int K, typename I>
__device__ __forceinline__ void input_offsets(const ElementwiseLayout<K>& layout, I flat, std::int64_t (&off)[K]) {
  I rem = flat;
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = 0;
#pragma unroll
  for (int d = kElementwiseMaxDims - 1; d > 0; --d) {
    if (d < layout.ndim) {
      const I size = static_cast<I>(layout.shape[d]);
      const I q = rem / size;
      const auto idx = static_cast<std::int64_t>(rem - q * size);
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += idx * layout.strides[k][d];
      rem = q;
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] += static_cast<std::int64_t>(rem) * layout.strides[k][0];
}

__device__ __forceinline__ std::uint64_t first_index() {
  return static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::uint64_t grid_stride() { return static_cast<std::uint64_t>(gridDim.x) * blockDim.x; }

// ---- kernels ----

template <typename T, typename I>
__global__ void unary_kernel(EwUnary op, T* out, const T* x, ElementwiseLayout<1> layout, std::uint64_t n, double p0,
                             double p1) {
  using C = compute_t<T>;
  const Params<C> p = make_params<C>(p0, p1);
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[1];
    input_offsets<1, I>(layout, static_cast<I>(i), off);
    out[i] = store<T>(apply_unary<C>(op, load(x[off[0]]), p));
  }
}

template <typename T, typename I>
__global__ void binary_kernel(EwBinary op, T* out, const T* a, const T* b, ElementwiseLayout<2> layout,
                              std::uint64_t n, double p0, double p1) {
  using C = compute_t<T>;
  const Params<C> p = make_params<C>(p0, p1);
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[2];
    input_offsets<2, I>(layout, static_cast<I>(i), off);
    out[i] = store<T>(apply_binary<C>(op, load(a[off[0]]), load(b[off[1]]), p));
  }
}

template <typename U, typename I>
__global__ void where_kernel(U* out, const std::uint8_t* cond, const U* a, const U* b, ElementwiseLayout<3> layout,
                             std::uint64_t n) {
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[3];
    input_offsets<3, I>(layout, static_cast<I>(i), off);
    out[i] = cond[off[0]] != 0 ? a[off[1]] : b[off[2]];  // any nonzero byte is true (cpu/convert.h)
  }
}

// Values as the CPU compares them with a double scalar: widened exactly to double.
__device__ __forceinline__ double to_double(float x) { return x; }
__device__ __forceinline__ double to_double(double x) { return x; }
__device__ __forceinline__ double to_double(__half x) { return __half2float(x); }
__device__ __forceinline__ double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double to_double(std::int8_t x) { return x; }
__device__ __forceinline__ double to_double(std::uint8_t x) { return x; }
__device__ __forceinline__ double to_double(std::int32_t x) { return x; }
__device__ __forceinline__ double to_double(std::int64_t x) { return static_cast<double>(x); }

template <typename T, typename I>
__global__ void compare_scalar_kernel(EwCompare op, std::uint8_t* out, const T* x, ElementwiseLayout<1> layout,
                                      std::uint64_t n, double s) {
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[1];
    input_offsets<1, I>(layout, static_cast<I>(i), off);
    const double v = to_double(x[off[0]]);
    out[i] = static_cast<std::uint8_t>(op == EwCompare::gt ? v > s : v < s);
  }
}

// Equality in the type the CPU compares in: floats in their compute type (an exact widening, so -0 == 0
// and NaN != NaN as in f32), integers as themselves, bools (as_truth) by truth.
template <typename T>
__device__ __forceinline__ bool equal(T p, T q, bool) { return load(p) == load(q); }
template <>
__device__ __forceinline__ bool equal<std::int8_t>(std::int8_t p, std::int8_t q, bool) { return p == q; }
template <>
__device__ __forceinline__ bool equal<std::uint8_t>(std::uint8_t p, std::uint8_t q, bool as_truth) {
  return as_truth ? (p != 0) == (q != 0) : p == q;
}
template <>
__device__ __forceinline__ bool equal<std::int32_t>(std::int32_t p, std::int32_t q, bool) { return p == q; }
template <>
__device__ __forceinline__ bool equal<std::int64_t>(std::int64_t p, std::int64_t q, bool) { return p == q; }

template <typename T, typename I>
__global__ void eq_kernel(std::uint8_t* out, const T* a, const T* b, ElementwiseLayout<2> layout, std::uint64_t n,
                          bool as_truth) {
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[2];
    input_offsets<2, I>(layout, static_cast<I>(i), off);
    out[i] = static_cast<std::uint8_t>(equal<T>(a[off[0]], b[off[1]], as_truth));
  }
}

// ---- dispatch ----

bool fits_u32(std::uint64_t n) { return n <= 0xffffffffull; }

template <typename F>
cudaError_t with_format(EwFormat format, F&& f) {
  switch (format) {
    case EwFormat::f32: return f(Tag<float>{});
    case EwFormat::f64: return f(Tag<double>{});
    case EwFormat::f16: return f(Tag<__half>{});
    case EwFormat::bf16: return f(Tag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// The float compare types are the EwFormat of the same name and value.
static_assert(static_cast<int>(EwCompareType::f32) == static_cast<int>(EwFormat::f32) &&
              static_cast<int>(EwCompareType::f64) == static_cast<int>(EwFormat::f64) &&
              static_cast<int>(EwCompareType::f16) == static_cast<int>(EwFormat::f16) &&
              static_cast<int>(EwCompareType::bf16) == static_cast<int>(EwFormat::bf16));

template <typename F>
cudaError_t with_compare_type(EwCompareType type, F&& f) {
  switch (type) {
    case EwCompareType::f32:
    case EwCompareType::f64:
    case EwCompareType::f16:
    case EwCompareType::bf16: return with_format(static_cast<EwFormat>(static_cast<int>(type)), f);
    case EwCompareType::i8: return f(Tag<std::int8_t>{});
    case EwCompareType::u8:
    case EwCompareType::boolean: return f(Tag<std::uint8_t>{});
    case EwCompareType::i32: return f(Tag<std::int32_t>{});
    case EwCompareType::i64: return f(Tag<std::int64_t>{});
  }
  return cudaErrorInvalidValue;
}

bool valid_layout(int ndim) { return ndim >= 1 && ndim <= kElementwiseMaxDims; }

// launch(Tag<I>{}) with the kernels' index type I: 32-bit arithmetic when n fits, else 64-bit; then the
// launch's error.
template <typename Launch>
cudaError_t launch_indexed(std::uint64_t n, Launch&& launch) {
  if (fits_u32(n)) {
    launch(Tag<std::uint32_t>{});
  } else {
    launch(Tag<std::uint64_t>{});
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_elementwise_unary(EwUnary op, EwFormat format, void* out, const void* x,
                                     const ElementwiseLayout<1>& layout, std::uint64_t n, double p0, double p1,
                                     cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!valid_layout(layout.ndim) || static_cast<int>(op) < 0 || op > EwUnary::clamp) return cudaErrorInvalidValue;
  return with_format(format, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out);
    const T* in = static_cast<const T*>(x);
    return launch_indexed(n, [&](auto index) {
      using I = typename decltype(index)::type;
      unary_kernel<T, I><<<grid_for(n), kThreads, 0, stream>>>(op, o, in, layout, n, p0, p1);
    });
  });
}

cudaError_t launch_elementwise_binary(EwBinary op, EwFormat format, void* out, const void* a, const void* b,
                                      const ElementwiseLayout<2>& layout, std::uint64_t n, double p0, double p1,
                                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!valid_layout(layout.ndim) || static_cast<int>(op) < 0 || op > EwBinary::silu_backward) {
    return cudaErrorInvalidValue;
  }
  return with_format(format, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    return launch_indexed(n, [&](auto index) {
      using I = typename decltype(index)::type;
      binary_kernel<T, I><<<grid_for(n), kThreads, 0, stream>>>(op, o, pa, pb, layout, n, p0, p1);
    });
  });
}

cudaError_t launch_elementwise_where(void* out, const std::uint8_t* cond, const void* a, const void* b,
                                     const ElementwiseLayout<3>& layout, std::uint64_t n, std::size_t elem_size,
                                     cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!valid_layout(layout.ndim)) return cudaErrorInvalidValue;
  auto launch = [&](auto tag) {
    using U = typename decltype(tag)::type;
    U* o = static_cast<U*>(out);
    const U* pa = static_cast<const U*>(a);
    const U* pb = static_cast<const U*>(b);
    return launch_indexed(n, [&](auto index) {
      using I = typename decltype(index)::type;
      where_kernel<U, I><<<grid_for(n), kThreads, 0, stream>>>(o, cond, pa, pb, layout, n);
    });
  };
  switch (elem_size) {
    case 1: return launch(Tag<std::uint8_t>{});
    case 2: return launch(Tag<std::uint16_t>{});
    case 4: return launch(Tag<std::uint32_t>{});
    case 8: return launch(Tag<std::uint64_t>{});
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_elementwise_compare_scalar(EwCompare op, EwCompareType type, std::uint8_t* out, const void* x,
                                              const ElementwiseLayout<1>& layout, std::uint64_t n, double s,
                                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!valid_layout(layout.ndim) || type == EwCompareType::boolean || (op != EwCompare::gt && op != EwCompare::lt)) {
    return cudaErrorInvalidValue;
  }
  return with_compare_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x);
    return launch_indexed(n, [&](auto index) {
      using I = typename decltype(index)::type;
      compare_scalar_kernel<T, I><<<grid_for(n), kThreads, 0, stream>>>(op, out, in, layout, n, s);
    });
  });
}

cudaError_t launch_elementwise_eq(EwCompareType type, std::uint8_t* out, const void* a, const void* b,
                                  const ElementwiseLayout<2>& layout, std::uint64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!valid_layout(layout.ndim)) return cudaErrorInvalidValue;
  const bool as_truth = type == EwCompareType::boolean;
  return with_compare_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    return launch_indexed(n, [&](auto index) {
      using I = typename decltype(index)::type;
      eq_kernel<T, I><<<grid_for(n), kThreads, 0, stream>>>(out, pa, pb, layout, n, as_truth);
    });
  });
}

}  // namespace memtrain::cuda
