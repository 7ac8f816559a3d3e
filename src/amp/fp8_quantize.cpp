// FP8 quantization (amp/fp8.h): per-tensor and blockwise quantize / dequantize and amax, on the CPU or on a
// CUDA device. The CPU loops are the reference: element rules of the CUDA path (kernels/convert.cuh:
// quantize_one, block_scale), written on the CPU conversions of core/float_types.h, which the CUDA rules copy
// bit for bit; they run over contiguous data, in parallel (OpenMP) over elements or tiles once the input is
// large enough to pay for threads. A CUDA tensor goes to the cuda:: entry point of the same name
// (cuda/convert.h) on a contiguous copy, with its outputs allocated on the same device.
#include "memtrain/amp/fp8.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/float_types.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace memtrain::amp {

namespace {

constexpr std::int64_t kParallelMin = 1 << 15;

bool is_fp8(DType t) { return t == DType::f8_e4m3 || t == DType::f8_e5m2; }

void check_source(const char* op, const Tensor& x) {
  MT_CHECK(x.defined(), op, "undefined input");
  MT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, op, "input dtype {} is not supported (f32, bf16)",
           dtype_name(x.dtype()));
  MT_CHECK(x.dim() >= 1, op, "input must have at least 1 dim, got a 0-dim tensor");
}

// The CUDA kernels count nothing, and a host copy just to count would hide a device round trip in the step.
void check_stats(const char* op, const Tensor& x, const QuantStats* stats) {
  MT_CHECK(stats == nullptr || x.device().is_cpu(), op,
           "QuantStats are counted on the CPU only; pass null for an input on {}", x.device().str());
}

void check_codes(const char* op, const Tensor& q, DType out) {
  MT_CHECK(q.defined(), op, "undefined codes");
  MT_CHECK(is_fp8(q.dtype()), op, "codes dtype {} is not an FP8 dtype (f8_e4m3, f8_e5m2)", dtype_name(q.dtype()));
  MT_CHECK(q.dim() >= 1, op, "codes must have at least 1 dim, got a 0-dim tensor");
  MT_CHECK(out == DType::f32 || out == DType::bf16, op, "output dtype {} is not supported (f32, bf16)",
           dtype_name(out));
}

float load(const float* p, std::int64_t i) { return p[i]; }
float load(const BFloat16* p, std::int64_t i) { return p[i].to_float(); }

void store(float* p, std::int64_t i, float v) { p[i] = v; }
void store(BFloat16* p, std::int64_t i, float v) { p[i] = BFloat16::from_float(v); }

// Code of x * scale (one f32 multiply, then the saturating cast), counted into st. Saturated means the
// product rounds past fp8_max at the format's precision: past the midpoint to the next step above the
// range, 464 for e4m3 (a tie goes down to 448, whose mantissa is even) and 61440 for e5m2 (a tie goes up,
// since 57344's mantissa is odd). Values that round to fp8_max anyway lose nothing to the clip.
template <bool kE4M3>
std::uint8_t quantize_one(float x, float scale, QuantStats& st) {
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
QuantStats quantize_typed(const Src* x, std::uint8_t* q, std::int64_t n, float scale) {
  std::int64_t saturated = 0, underflowed = 0, nonfinite = 0;
#pragma omp parallel for reduction(+ : saturated, underflowed, nonfinite) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) {
    QuantStats st;
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
QuantStats quantize_blockwise_typed(const Src* x, std::uint8_t* q, float* inv_scales, std::int64_t rows,
                                    std::int64_t cols, std::int64_t tile_rows) {
  const std::int64_t scale_cols = cuda::fp8_scale_cols(cols);
  const std::int64_t num_tiles = (rows + tile_rows - 1) / tile_rows * scale_cols;
  const float m = kE4M3 ? 448.0f : 57344.0f;
  std::int64_t saturated = 0, underflowed = 0, nonfinite = 0;
#pragma omp parallel for reduction(+ : saturated, underflowed, nonfinite) if (rows * cols >= kParallelMin)
  for (std::int64_t tile = 0; tile < num_tiles; ++tile) {
    const std::int64_t r0 = tile / scale_cols * tile_rows, r1 = std::min(rows, r0 + tile_rows);
    const std::int64_t c0 = tile % scale_cols * cuda::kFp8TileCols, c1 = std::min(cols, c0 + cuda::kFp8TileCols);
    std::uint32_t amax_bits = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t c = c0; c < c1; ++c) amax_bits = std::max(amax_bits, abs_bits(load(x, r * cols + c)));
    }
    float scale = 1.0f;
    block_scale(std::bit_cast<float>(amax_bits), m, &scale, &inv_scales[tile]);
    QuantStats st;
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
  const std::int64_t scale_cols = cuda::fp8_scale_cols(cols);
#pragma omp parallel for if (rows * cols >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = inv_scales + r / tile_rows * scale_cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      store(out, r * cols + c, dequantize_one<kE4M3>(q[r * cols + c], s[c / cuda::kFp8TileCols]));
    }
  }
}

// Calls fn(src_tag, e4m3_tag) with a null pointer of the source element type and the format as a
// compile-time bool, so each public function instantiates its four kernels in one place.
template <typename Fn>
void dispatch(DType t, bool e4m3, Fn&& fn) {
  const auto with_format = [&](auto* tag) {
    if (e4m3) fn(tag, std::true_type{});
    else fn(tag, std::false_type{});
  };
  if (t == DType::f32) with_format(static_cast<float*>(nullptr));
  else with_format(static_cast<BFloat16*>(nullptr));
}

void add_to(QuantStats* total, const QuantStats& st) {
  if (total == nullptr) return;
  total->saturated += st.saturated;
  total->underflowed += st.underflowed;
  total->nonfinite += st.nonfinite;
}

// x as a (rows, cols) matrix: cols is the last dim.
std::int64_t matrix_rows(const Tensor& x) {
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return rows;
}

std::size_t count(const Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// One device f32 that a kernel writes an amax into (0 when n == 0): a transient, so workspace.
Tensor device_float(Device device) {
  CategoryGuard workspace(MemoryCategory::workspace);
  return Tensor::empty({1}, DType::f32, device);
}

// The host copy of a device float; the copy waits for the kernel that writes it.
float read_back(const Tensor& f) { return static_cast<float>(f.item()); }

// ---- the CPU path ----

float amax_cpu(const Tensor& xc) {
  float out = 0.0f;
  dispatch(xc.dtype(), true, [&](auto* src_tag, auto) {
    using Src = std::remove_pointer_t<decltype(src_tag)>;
    out = amax_typed(static_cast<const Src*>(xc.data_ptr()), xc.numel());
  });
  return out;
}

QuantStats quantize_cpu(const Tensor& xc, Fp8Format f, float scale, Tensor& q) {
  QuantStats st;
  dispatch(xc.dtype(), f == Fp8Format::e4m3, [&](auto* src_tag, auto e4m3) {
    using Src = std::remove_pointer_t<decltype(src_tag)>;
    st = quantize_typed<Src, decltype(e4m3)::value>(static_cast<const Src*>(xc.data_ptr()), q.data<std::uint8_t>(),
                                                    xc.numel(), scale);
  });
  return st;
}

void dequantize_cpu(const Tensor& qc, float inv_scale, Tensor& y) {
  dispatch(y.dtype(), qc.dtype() == DType::f8_e4m3, [&](auto* dst_tag, auto e4m3) {
    using Dst = std::remove_pointer_t<decltype(dst_tag)>;
    dequantize_typed<Dst, decltype(e4m3)::value>(qc.data<const std::uint8_t>(), static_cast<Dst*>(y.data_ptr()),
                                                 qc.numel(), inv_scale);
  });
}

QuantStats quantize_blockwise_cpu(const Tensor& xc, Fp8Format f, BlockwiseFp8& r) {
  QuantStats st;
  dispatch(xc.dtype(), f == Fp8Format::e4m3, [&](auto* src_tag, auto e4m3) {
    using Src = std::remove_pointer_t<decltype(src_tag)>;
    st = quantize_blockwise_typed<Src, decltype(e4m3)::value>(static_cast<const Src*>(xc.data_ptr()),
                                                              r.codes.data<std::uint8_t>(), r.inv_scales.data<float>(),
                                                              matrix_rows(xc), xc.size(-1),
                                                              cuda::fp8_tile_rows(r.tiling));
  });
  return st;
}

void dequantize_blockwise_cpu(const Tensor& qc, const Tensor& sc, Fp8Tiling tiling, Tensor& y) {
  dispatch(y.dtype(), qc.dtype() == DType::f8_e4m3, [&](auto* dst_tag, auto e4m3) {
    using Dst = std::remove_pointer_t<decltype(dst_tag)>;
    dequantize_blockwise_typed<Dst, decltype(e4m3)::value>(qc.data<const std::uint8_t>(), sc.data<const float>(),
                                                           static_cast<Dst*>(y.data_ptr()), matrix_rows(qc),
                                                           qc.size(-1), cuda::fp8_tile_rows(tiling));
  });
}

// ---- the CUDA path: the same rules in cuda/convert.h, on contiguous buffers of one device ----

float amax_cuda(const Tensor& xc) {
  const Tensor out = device_float(xc.device());
  cuda::amax(xc.data_ptr(), xc.dtype(), count(xc), out.data<float>(), xc.device().index);
  return read_back(out);
}

// amax: null, or a device float that receives max |x| from the same pass.
void quantize_cuda(const Tensor& xc, float scale, Tensor& q, float* amax) {
  cuda::quantize_fp8(xc.data_ptr(), xc.dtype(), scale, q.data_ptr(), q.dtype(), count(xc), amax, xc.device().index);
}

void dequantize_cuda(const Tensor& qc, float inv_scale, Tensor& y) {
  cuda::dequantize_fp8(qc.data_ptr(), qc.dtype(), inv_scale, y.data_ptr(), y.dtype(), count(qc), qc.device().index);
}

void quantize_blockwise_cuda(const Tensor& xc, BlockwiseFp8& r) {
  cuda::quantize_fp8_blockwise(xc.data_ptr(), xc.dtype(), r.codes.data_ptr(), r.codes.dtype(),
                               r.inv_scales.data<float>(), matrix_rows(xc), xc.size(-1), r.tiling, xc.device().index);
}

void dequantize_blockwise_cuda(const Tensor& qc, const Tensor& sc, Fp8Tiling tiling, Tensor& y) {
  cuda::dequantize_fp8_blockwise(qc.data_ptr(), qc.dtype(), sc.data<const float>(), y.data_ptr(), y.dtype(),
                                 matrix_rows(qc), qc.size(-1), tiling, qc.device().index);
}

// The checks of quantize_fp8, shared with quantize_fp8_with_amax.
void check_quantize(const char* op, const Tensor& x, float scale, const QuantStats* stats) {
  check_source(op, x);
  check_stats(op, x, stats);
  MT_CHECK(std::isfinite(scale) && scale > 0.0f, op, "scale must be finite and > 0, got {}", scale);
}

}  // namespace

float amax(const Tensor& x) {
  check_source("amp::amax", x);
  const Tensor xc = x.contiguous();
  return xc.device().is_cuda() ? amax_cuda(xc) : amax_cpu(xc);
}

Tensor quantize_fp8(const Tensor& x, Fp8Format f, float scale, QuantStats* stats) {
  check_quantize("amp::quantize_fp8", x, scale, stats);
  const Tensor xc = x.contiguous();
  Tensor q = Tensor::empty(x.shape(), fp8_dtype(f), x.device());
  if (xc.device().is_cuda()) quantize_cuda(xc, scale, q, nullptr);
  else add_to(stats, quantize_cpu(xc, f, scale, q));
  return q;
}

Fp8WithAmax quantize_fp8_with_amax(const Tensor& x, Fp8Format f, float scale) {
  check_quantize("amp::quantize_fp8_with_amax", x, scale, nullptr);
  const Tensor xc = x.contiguous();
  Fp8WithAmax r{Tensor::empty(x.shape(), fp8_dtype(f), x.device()), 0.0f};
  if (xc.device().is_cuda()) {
    const Tensor amax_out = device_float(xc.device());
    quantize_cuda(xc, scale, r.codes, amax_out.data<float>());
    r.amax = read_back(amax_out);
  } else {
    quantize_cpu(xc, f, scale, r.codes);
    r.amax = amax_cpu(xc);
  }
  return r;
}

Tensor dequantize_fp8(const Tensor& q, float inv_scale, DType out) {
  constexpr const char* op = "amp::dequantize_fp8";
  check_codes(op, q, out);
  MT_CHECK(std::isfinite(inv_scale) && inv_scale > 0.0f, op, "inv_scale must be finite and > 0, got {}", inv_scale);
  const Tensor qc = q.contiguous();
  Tensor y = Tensor::empty(q.shape(), out, q.device());
  if (qc.device().is_cuda()) dequantize_cuda(qc, inv_scale, y);
  else dequantize_cpu(qc, inv_scale, y);
  return y;
}

BlockwiseFp8 quantize_fp8_blockwise(const Tensor& x, Fp8Format f, Fp8Tiling t, QuantStats* stats) {
  constexpr const char* op = "amp::quantize_fp8_blockwise";
  check_source(op, x);
  check_stats(op, x, stats);
  const Tensor xc = x.contiguous();
  const std::int64_t cols = x.size(-1), rows = matrix_rows(x);
  BlockwiseFp8 r{Tensor::empty(x.shape(), fp8_dtype(f), x.device()),
                 Tensor::empty({cuda::fp8_scale_rows(rows, t), cuda::fp8_scale_cols(cols)}, DType::f32, x.device()), t};
  if (xc.device().is_cuda()) quantize_blockwise_cuda(xc, r);
  else add_to(stats, quantize_blockwise_cpu(xc, f, r));
  return r;
}

Tensor dequantize_fp8_blockwise(const BlockwiseFp8& q, DType out) {
  constexpr const char* op = "amp::dequantize_fp8_blockwise";
  check_codes(op, q.codes, out);
  const std::int64_t cols = q.codes.size(-1), rows = matrix_rows(q.codes);
  const Shape grid{cuda::fp8_scale_rows(rows, q.tiling), cuda::fp8_scale_cols(cols)};
  MT_CHECK(q.inv_scales.defined() && q.inv_scales.dtype() == DType::f32, op, "inv_scales must be an f32 tensor");
  MT_CHECK(q.inv_scales.device() == q.codes.device(), op, "inv_scales are on {}, the codes on {}: want one device",
           q.inv_scales.device().str(), q.codes.device().str());
  MT_CHECK(q.inv_scales.shape() == grid, op, "inv_scales shape {} does not match codes {} tiled {}: want {}",
           shape_str(q.inv_scales.shape()), shape_str(q.codes.shape()),
           q.tiling == Fp8Tiling::row_1x128 ? "1x128" : "128x128", shape_str(grid));
  const Tensor qc = q.codes.contiguous();
  const Tensor sc = q.inv_scales.contiguous();
  Tensor y = Tensor::empty(q.codes.shape(), out, q.codes.device());
  if (qc.device().is_cuda()) dequantize_blockwise_cuda(qc, sc, q.tiling, y);
  else dequantize_blockwise_cpu(qc, sc, q.tiling, y);
  return y;
}

}  // namespace memtrain::amp
