// FP8 quantization (amp/fp8.h): per-tensor and blockwise quantize / dequantize and amax on any device. These
// front-ends check the operands, make a strided input contiguous, allocate the results on the input's device and
// call that device's backend (src/core/backend.h): the CPU loops of src/cpu/fp8.cpp are the reference, CUDA runs
// the entry points of the same name in cuda/convert.h, meta computes nothing (an amax is 0).
#include "memtrain/amp/fp8.h"

#include "core/backend.h"
#include "memtrain/core/error.h"

#include <cmath>
#include <cstdint>

namespace memtrain::amp {

namespace {

bool is_fp8(DType t) { return t == DType::f8_e4m3 || t == DType::f8_e5m2; }

void check_source(const char* op, const Tensor& x) {
  MT_CHECK(x.defined(), op, "undefined input");
  MT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, op, "input dtype {} is not supported (f32, bf16)",
           dtype_name(x.dtype()));
  MT_CHECK(x.dim() >= 1, op, "input must have at least 1 dim, got a 0-dim tensor");
}

void check_codes(const char* op, const Tensor& q, DType out) {
  MT_CHECK(q.defined(), op, "undefined codes");
  MT_CHECK(is_fp8(q.dtype()), op, "codes dtype {} is not an FP8 dtype (f8_e4m3, f8_e5m2)", dtype_name(q.dtype()));
  MT_CHECK(q.dim() >= 1, op, "codes must have at least 1 dim, got a 0-dim tensor");
  MT_CHECK(out == DType::f32 || out == DType::bf16, op, "output dtype {} is not supported (f32, bf16)",
           dtype_name(out));
}

// Only the CPU counts: the CUDA kernels count nothing, and a host copy just to count would hide a device round
// trip in the step (meta has nothing to count). The backend says whether it counted.
void add_to(const char* op, const Tensor& x, QuantStats* total, const detail::Backend::Fp8Counts& st) {
  if (total == nullptr) return;
  MT_CHECK(st.counted, op, "QuantStats are counted on the CPU only; pass null for an input on {}", x.device().str());
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

// The checks of quantize_fp8, shared with quantize_fp8_with_amax.
void check_quantize(const char* op, const Tensor& x, float scale) {
  check_source(op, x);
  MT_CHECK(std::isfinite(scale) && scale > 0.0f, op, "scale must be finite and > 0, got {}", scale);
}

}  // namespace

float amax(const Tensor& x) {
  check_source("amp::amax", x);
  const Tensor xc = x.contiguous();
  return detail::backend_for(xc.device()).amax(xc);
}

Tensor quantize_fp8(const Tensor& x, Fp8Format f, float scale, QuantStats* stats) {
  check_quantize("amp::quantize_fp8", x, scale);
  const Tensor xc = x.contiguous();
  Tensor q = Tensor::empty(x.shape(), fp8_dtype(f), x.device());
  add_to("amp::quantize_fp8", x, stats, detail::backend_for(xc.device()).quantize_fp8(q, xc, scale, nullptr));
  return q;
}

Fp8WithAmax quantize_fp8_with_amax(const Tensor& x, Fp8Format f, float scale) {
  check_quantize("amp::quantize_fp8_with_amax", x, scale);
  const Tensor xc = x.contiguous();
  Fp8WithAmax r{Tensor::empty(x.shape(), fp8_dtype(f), x.device()), 0.0f};
  detail::backend_for(xc.device()).quantize_fp8(r.codes, xc, scale, &r.amax);
  return r;
}

Tensor dequantize_fp8(const Tensor& q, float inv_scale, DType out) {
  constexpr const char* op = "amp::dequantize_fp8";
  check_codes(op, q, out);
  MT_CHECK(std::isfinite(inv_scale) && inv_scale > 0.0f, op, "inv_scale must be finite and > 0, got {}", inv_scale);
  const Tensor qc = q.contiguous();
  Tensor y = Tensor::empty(q.shape(), out, q.device());
  detail::backend_for(qc.device()).dequantize_fp8(y, qc, inv_scale);
  return y;
}

BlockwiseFp8 quantize_fp8_blockwise(const Tensor& x, Fp8Format f, Fp8Tiling t, QuantStats* stats) {
  constexpr const char* op = "amp::quantize_fp8_blockwise";
  check_source(op, x);
  const Tensor xc = x.contiguous();
  const std::int64_t cols = x.size(-1), rows = matrix_rows(x);
  BlockwiseFp8 r{Tensor::empty(x.shape(), fp8_dtype(f), x.device()),
                 Tensor::empty({fp8_scale_rows(rows, t), fp8_scale_cols(cols)}, DType::f32, x.device()), t};
  add_to(op, x, stats, detail::backend_for(xc.device()).quantize_fp8_blockwise(r.codes, r.inv_scales, xc, t));
  return r;
}

Tensor dequantize_fp8_blockwise(const BlockwiseFp8& q, DType out) {
  constexpr const char* op = "amp::dequantize_fp8_blockwise";
  check_codes(op, q.codes, out);
  const std::int64_t cols = q.codes.size(-1), rows = matrix_rows(q.codes);
  const Shape grid{fp8_scale_rows(rows, q.tiling), fp8_scale_cols(cols)};
  MT_CHECK(q.inv_scales.defined() && q.inv_scales.dtype() == DType::f32, op, "inv_scales must be an f32 tensor");
  MT_CHECK(q.inv_scales.device() == q.codes.device(), op, "inv_scales are on {}, the codes on {}: want one device",
           q.inv_scales.device().str(), q.codes.device().str());
  MT_CHECK(q.inv_scales.shape() == grid, op, "inv_scales shape {} does not match codes {} tiled {}: want {}",
           shape_str(q.inv_scales.shape()), shape_str(q.codes.shape()),
           q.tiling == Fp8Tiling::row_1x128 ? "1x128" : "128x128", shape_str(grid));
  const Tensor qc = q.codes.contiguous();
  const Tensor sc = q.inv_scales.contiguous();
  Tensor y = Tensor::empty(q.codes.shape(), out, q.codes.device());
  detail::backend_for(qc.device()).dequantize_fp8_blockwise(y, qc, sc, q.tiling);
  return y;
}

}  // namespace memtrain::amp
