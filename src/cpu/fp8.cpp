// FP8 on the CPU: the contract's amax, quantize_fp8, dequantize_fp8 and their blockwise forms, and the f32 GEMM
// and column sums of amp::fp8_linear's emulation. The quantization loops are the
// reference loops of amp/fp8.h. Element rules of the CUDA path (kernels/convert.cuh: quantize_one, block_scale),
// written on the CPU conversions of core/float_types.h, which the CUDA rules copy bit for bit; they run over
// contiguous data, in parallel (OpenMP) over elements or tiles once the input is large enough to pay for
// threads. Each entry runs its loop only under runs_kernels(): on meta nothing is read, the counts are zero and
// an amax is 0.
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"

#include "memtrain/core/float_types.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace memtrain::cpu {

namespace {

using Fp8Counts = detail::Backend::Fp8Counts;

constexpr std::int64_t kParallelMin = 1 << 15;

float load(const float* p, std::int64_t i) { return p[i]; }
float load(const BFloat16* p, std::int64_t i) { return p[i].to_float(); }

void store(float* p, std::int64_t i, float v) { p[i] = v; }
void store(BFloat16* p, std::int64_t i, float v) { p[i] = BFloat16::from_float(v); }

// Code of x * scale (one f32 multiply, then the saturating cast), counted into st. Saturated means the
// product rounds past fp8_max at the format's precision: past the midpoint to the next step above the
// range, 464 for e4m3 (a tie goes down to 448, whose mantissa is even) and 61440 for e5m2 (a tie goes up,
// since 57344's mantissa is odd). Values that round to fp8_max anyway lose nothing to the clip.
template <bool kE4M3>
std::uint8_t quantize_one(float x, float scale, Fp8Counts& st) {
  const float y = x * scale;
  const float a = std::fabs(y);
  const std::uint8_t code = kE4M3 ? Float8E4M3::from_float(y).bits : Float8E5M2::from_float(y).bits;
  const bool finite = a <= std::numeric_limits<float>::max();  // false for Inf and NaN
  st.nonfinite += !finite;
  st.saturated += finite && (kE4M3 ? a > 464.0f : a >= 61440.0f);
  st.underflowed += x != 0.0f && finite && (code & 0x7fu) == 0;
  return code;
}

template <bool kE4M3>
float decode(std::uint8_t code) {
  if constexpr (kE4M3) return Float8E4M3::from_bits(code).to_float();
  else return Float8E5M2::from_bits(code).to_float();
}

// fp8_value * inv_scale in f32; a NaN code passes through as decoded, as on the GPU.
template <bool kE4M3>
float dequantize_one(std::uint8_t code, float inv_scale) {
  const float v = decode<kE4M3>(code);
  return std::isnan(v) ? v : v * inv_scale;
}

// The block scale rule of cuda/convert.h: fp8_max / amax and amax / fp8_max, or 1 and 1 when amax is 0,
// Inf or NaN, or the scale overflows.
void block_scale(float amax, float fp8_max_value, float* scale, float* inv_scale) {
  constexpr float kFloatMax = std::numeric_limits<float>::max();
  if (amax > 0.0f && amax <= kFloatMax) {
    const float s = fp8_max_value / amax;
    if (s <= kFloatMax) {
      *scale = s;
      *inv_scale = amax / fp8_max_value;
      return;
    }
  }
  *scale = 1.0f;
  *inv_scale = 1.0f;
}

// max |v| as the bits of |v|: integer order equals float order for non-negative floats, and every NaN
// sorts above Inf, so a NaN anywhere makes the result NaN (the GPU reduction does the same).
std::uint32_t abs_bits(float v) { return std::bit_cast<std::uint32_t>(v) & 0x7fffffffu; }

template <typename Src>
float amax_typed(const Src* x, std::int64_t n) {
  std::uint32_t m = 0;
#pragma omp parallel for reduction(max : m) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, abs_bits(load(x, i)));
  return std::bit_cast<float>(m);
}

// The counters are plain integers in the loops so that OpenMP can reduce them.
template <typename Src, bool kE4M3>
Fp8Counts quantize_typed(const Src* x, std::uint8_t* q, std::int64_t n, float scale) {
  std::int64_t saturated = 0, underflowed = 0, nonfinite = 0;
#pragma omp parallel for reduction(+ : saturated, underflowed, nonfinite) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    Fp8Counts st;
    q[i] = quantize_one<kE4M3>(load(x, i), scale, st);
    saturated += st.saturated;
    underflowed += st.underflowed;
    nonfinite += st.nonfinite;
  }
  return {saturated, underflowed, nonfinite};
}

template <typename Dst, bool kE4M3>
void dequantize_typed(const std::uint8_t* q, Dst* out, std::int64_t n, float inv_scale) {
#pragma omp parallel for if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) store(out, i, dequantize_one<kE4M3>(q[i], inv_scale));
}

// One tile per iteration: amax over the tile, its scale, then the codes. Tiles are numbered row-major
// over the scale grid, which is also the index of the tile's inverse scale.
template <typename Src, bool kE4M3>
Fp8Counts quantize_blockwise_typed(const Src* x, std::uint8_t* q, float* inv_scales, std::int64_t rows,
                                   std::int64_t cols, std::int64_t tile_rows) {
  const std::int64_t scale_cols = fp8_scale_cols(cols);
  const std::int64_t num_tiles = (rows + tile_rows - 1) / tile_rows * scale_cols;
  const float m = kE4M3 ? 448.0f : 57344.0f;
  std::int64_t saturated = 0, underflowed = 0, nonfinite = 0;
#pragma omp parallel for reduction(+ : saturated, underflowed, nonfinite) if (rows * cols >= kParallelMin)
  for (std::int64_t tile = 0; tile < num_tiles; ++tile) {
    const std::int64_t r0 = tile / scale_cols * tile_rows, r1 = std::min(rows, r0 + tile_rows);
    const std::int64_t c0 = tile % scale_cols * kFp8TileCols, c1 = std::min(cols, c0 + kFp8TileCols);
    std::uint32_t amax_bits = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t c = c0; c < c1; ++c) amax_bits = std::max(amax_bits, abs_bits(load(x, r * cols + c)));
    }
    float scale = 1.0f;
    block_scale(std::bit_cast<float>(amax_bits), m, &scale, &inv_scales[tile]);
    Fp8Counts st;
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t c = c0; c < c1; ++c) q[r * cols + c] = quantize_one<kE4M3>(load(x, r * cols + c), scale, st);
    }
    saturated += st.saturated;
    underflowed += st.underflowed;
    nonfinite += st.nonfinite;
  }
  return {saturated, underflowed, nonfinite};
}

template <typename Dst, bool kE4M3>
void dequantize_blockwise_typed(const std::uint8_t* q, const float* inv_scales, Dst* out, std::int64_t rows,
                                std::int64_t cols, std::int64_t tile_rows) {
  const std::int64_t scale_cols = fp8_scale_cols(cols);
#pragma omp parallel for if (rows * cols >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = inv_scales + r / tile_rows * scale_cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      store(out, r * cols + c, dequantize_one<kE4M3>(q[r * cols + c], s[c / kFp8TileCols]));
    }
  }
}

// Calls fn(src_tag, e4m3_tag) with a null pointer of the source element type and the format as a
// compile-time bool, so each entry instantiates its four kernels in one place.
template <typename Fn>
void dispatch(DType t, bool e4m3, Fn&& fn) {
  const auto with_format = [&](auto* tag) {
    if (e4m3) fn(tag, std::true_type{});
    else fn(tag, std::false_type{});
  };
  if (t == DType::f32) with_format(static_cast<float*>(nullptr));
  else with_format(static_cast<BFloat16*>(nullptr));
}

// x as a (rows, cols) matrix: cols is the last dim.
std::int64_t matrix_rows(const Tensor& x) {
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return rows;
}

template <typename T>
void add_rows(const T* g, std::int64_t rows, std::int64_t cols, double* sums) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) sums[c] += load(g, r * cols + c);
  }
}

float amax_of(const Tensor& x) {
  float out = 0.0f;
  dispatch(x.dtype(), true, [&](auto* src_tag, auto) {
    using Src = std::remove_pointer_t<decltype(src_tag)>;
    out = amax_typed(static_cast<const Src*>(x.data_ptr()), x.numel());
  });
  return out;
}

}  // namespace

float CpuBackend::amax(const Tensor& x) const { return runs_kernels() ? amax_of(x) : 0.0f; }

// A second pass for the amax: the CPU loops stay the reference ones, each with one job.
Fp8Counts CpuBackend::quantize_fp8(const Tensor& codes, const Tensor& x, float scale, float* amax_out) const {
  Fp8Counts st;
  if (amax_out != nullptr) *amax_out = 0.0f;
  if (!runs_kernels()) return st;
  dispatch(x.dtype(), codes.dtype() == DType::f8_e4m3, [&](auto* src_tag, auto e4m3) {
    using Src = std::remove_pointer_t<decltype(src_tag)>;
    st = quantize_typed<Src, decltype(e4m3)::value>(static_cast<const Src*>(x.data_ptr()),
                                                    codes.data<std::uint8_t>(), x.numel(), scale);
  });
  if (amax_out != nullptr) *amax_out = amax_of(x);
  st.counted = true;
  return st;
}

void CpuBackend::dequantize_fp8(const Tensor& out, const Tensor& codes, float inv_scale) const {
  if (!runs_kernels()) return;
  dispatch(out.dtype(), codes.dtype() == DType::f8_e4m3, [&](auto* dst_tag, auto e4m3) {
    using Dst = std::remove_pointer_t<decltype(dst_tag)>;
    dequantize_typed<Dst, decltype(e4m3)::value>(codes.data<const std::uint8_t>(), static_cast<Dst*>(out.data_ptr()),
                                                 codes.numel(), inv_scale);
  });
}

Fp8Counts CpuBackend::quantize_fp8_blockwise(const Tensor& codes, const Tensor& inv_scales, const Tensor& x,
                                             Fp8Tiling tiling) const {
  Fp8Counts st;
  if (!runs_kernels()) return st;
  dispatch(x.dtype(), codes.dtype() == DType::f8_e4m3, [&](auto* src_tag, auto e4m3) {
    using Src = std::remove_pointer_t<decltype(src_tag)>;
    st = quantize_blockwise_typed<Src, decltype(e4m3)::value>(static_cast<const Src*>(x.data_ptr()),
                                                              codes.data<std::uint8_t>(), inv_scales.data<float>(),
                                                              matrix_rows(x), x.size(-1), fp8_tile_rows(tiling));
  });
  st.counted = true;
  return st;
}

void CpuBackend::dequantize_fp8_blockwise(const Tensor& out, const Tensor& codes, const Tensor& inv_scales,
                                          Fp8Tiling tiling) const {
  if (!runs_kernels()) return;
  dispatch(out.dtype(), codes.dtype() == DType::f8_e4m3, [&](auto* dst_tag, auto e4m3) {
    using Dst = std::remove_pointer_t<decltype(dst_tag)>;
    dequantize_blockwise_typed<Dst, decltype(e4m3)::value>(codes.data<const std::uint8_t>(),
                                                           inv_scales.data<const float>(),
                                                           static_cast<Dst*>(out.data_ptr()), matrix_rows(codes),
                                                           codes.size(-1), fp8_tile_rows(tiling));
  });
}

// f64 sums in row order, rounded once into out's dtype by the copy.
void CpuBackend::column_sums(const Tensor& out, const Tensor& g) const {
  Tensor sums;
  {
    CategoryGuard workspace(MemoryCategory::workspace);
    sums = zeros({g.size(1)}, DType::f64, g.device());
  }
  if (runs_kernels()) {
    if (g.dtype() == DType::f32) add_rows(g.data<float>(), g.size(0), g.size(1), sums.data<double>());
    else add_rows(static_cast<const BFloat16*>(g.data_ptr()), g.size(0), g.size(1), sums.data<double>());
  }
  Tensor dst = out;  // a handle: copy_ writes the caller's storage
  dst.copy_(sums);
}

}  // namespace memtrain::cpu
