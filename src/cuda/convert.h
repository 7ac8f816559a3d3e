// CUDA dtype conversion, FP8 scaling and reductions on contiguous device buffers: raw-pointer entry points
// as in cuda.h (the device's current stream, stream.h; a launch error throws at once; errors are
// memtrain::Error "cuda::<name>: ..."; argument errors throw before the device is touched). Without CUDA
// every function throws "cuda::<name>: memtrain was built without CUDA".
//
// Conversions follow the CPU rules exactly (cpu/convert.h, core/float_types.h): one rounding to nearest
// even; f16/bf16 overflow to Inf; f8_e4m3 / f8_e5m2 saturate to +-448 / +-57344 and keep NaN (e4m3 has no
// Inf: +-Inf -> NaN); -0 stays -0. A CUDA cast equals cpu::convert bit for bit.
//
// Scaled FP8 (per tensor): q = fp8(f32(x * scale)), rounded as a cast, so values past the range saturate;
// dequantized value = f32(fp8_value(q) * inv_scale), rounded to the output dtype.
// Blockwise FP8 (DeepSeek-V3): a row-major (rows, cols) matrix is cut into tiles of 1x128 (activations,
// one scale per row per 128 columns) or 128x128 (weights); edge tiles are partial. Per tile:
// amax = max |x|, scale = fp8_max / amax, inv_scale = amax / fp8_max (f32 divisions); amax 0, Inf or NaN
// (or a scale that overflows f32) gives scale = inv_scale = 1. The codes keep the matrix layout; the
// inverse scales form a row-major (fp8_scale_rows, fp8_scale_cols) f32 matrix.
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/core/fp8_tiling.h"

#include <cstddef>
#include <cstdint>

namespace memtrain::cuda {

// dst[i] = src[i] converted, i < n. Both dtypes from {f64, f32, f16, bf16, f8_e4m3, f8_e5m2}. src == dst is
// allowed when both have the same size; other overlaps are not.
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n, int device);

// dst[i] = fp8(src[i] * scale), i < n. src: f32 or bf16 (n elements); dst: f8_e4m3 or f8_e5m2 codes. The
// scale is given by value, or as a pointer to one device float (read by the kernel, so it may come from
// earlier device work). amax: null, or a device float that receives max |src[i]| (0 when n == 0, NaN
// when any element is NaN), computed in the same pass; it must not be the scale's float.
void quantize_fp8(const void* src, DType src_dtype, float scale, void* dst, DType dst_dtype, std::size_t n,
                  float* amax, int device);
void quantize_fp8(const void* src, DType src_dtype, const float* scale, void* dst, DType dst_dtype, std::size_t n,
                  float* amax, int device);

// dst[i] = fp8_value(src[i]) * inv_scale, i < n. src: f8_e4m3 or f8_e5m2; dst: f32 or bf16. inv_scale by
// value or as a pointer to one device float.
void dequantize_fp8(const void* src, DType src_dtype, float inv_scale, void* dst, DType dst_dtype, std::size_t n,
                    int device);
void dequantize_fp8(const void* src, DType src_dtype, const float* inv_scale, void* dst, DType dst_dtype,
                    std::size_t n, int device);

// Tile shapes and scale-grid geometry of blockwise FP8: the one definition of core/fp8_tiling.h.
using ::memtrain::Fp8Tiling;
using ::memtrain::fp8_scale_cols;
using ::memtrain::fp8_scale_rows;
using ::memtrain::fp8_tile_rows;
using ::memtrain::kFp8TileCols;

// src (rows, cols) f32 or bf16 -> dst (rows, cols) f8_e4m3 / f8_e5m2 codes and
// inv_scales (fp8_scale_rows, fp8_scale_cols) f32, all row-major and contiguous.
void quantize_fp8_blockwise(const void* src, DType src_dtype, void* dst, DType dst_dtype, float* inv_scales,
                            std::int64_t rows, std::int64_t cols, Fp8Tiling tiling, int device);
// The inverse: dst (rows, cols) f32 or bf16 = fp8_value(src) * the tile's inverse scale.
void dequantize_fp8_blockwise(const void* src, DType src_dtype, const float* inv_scales, void* dst, DType dst_dtype,
                              std::int64_t rows, std::int64_t cols, Fp8Tiling tiling, int device);

// Reductions of f32, bf16 or f16 input into device f32 outputs.
// amax: *out = max |src[i]| (0 when n == 0; NaN when any element is NaN). Deterministic.
void amax(const void* src, DType dtype, std::size_t n, float* out, int device);
// sum: *out = sum of src[0, n) (0 when n == 0), accumulated in f64 in a fixed order that depends only on n,
// rounded once to f32: two runs give identical bits.
void sum(const void* src, DType dtype, std::size_t n, float* out, int device);
// sum_rows: src (rows, cols) row-major; out[r] = sum of row r (0 when cols == 0), rows floats. f64
// accumulation in a fixed order, rounded once to f32.
void sum_rows(const void* src, DType dtype, std::int64_t rows, std::int64_t cols, float* out, int device);

}  // namespace memtrain::cuda
