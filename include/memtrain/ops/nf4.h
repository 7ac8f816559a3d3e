// NF4 storage for frozen base matrices (QLoRA, Dettmers et al. 2023) and a linear op that dequantises it tile by
// tile, so the full-precision matrix never exists.
//
// Layout (bitsandbytes' quantize_4bit with compress_statistics=True, quant_type "nf4"):
// - the [out, in] matrix is flattened row-major and cut into blocks of 64 elements (blocks may span rows);
// - each block keeps absmax = max |w| and 4-bit codes of w / absmax (rounded to f32), the index of the nearest of
//   the 16 NF4 levels (ties go to the lower level); two codes per byte, the even element in the HIGH nibble;
// - the block absmaxes, minus their mean (absmax_mean), are quantised with memtrain's signed 8-bit dynamic map
//   (memtrain/core/quant_map.h) in blocks of 256, each with one f32 scale (its largest-magnitude value, signed).
// Dequantised: w = nf4[code] * (dynamic[absmax_code] * scale + absmax_mean), in f32.
// Bits per element: 4 + 8/64 + 32/(64*256) = 4.127 (plus the one float mean).
//
// The element count must be a multiple of 64 (a row length need not be): other shapes are refused.
#pragma once

#include "memtrain/core/tensor.h"

#include <array>
#include <cstdint>

namespace memtrain::ops {

inline constexpr std::int64_t kNf4BlockSize = 64;         // elements per absmax
inline constexpr std::int64_t kNf4AbsmaxBlockSize = 256;  // absmaxes per f32 scale (the double quantisation)

// The 16 NF4 levels, ascending: -1, 7 negative, exact 0 (code 7), 7 positive, +1.
const std::array<float, 16>& nf4_levels();

struct Nf4Weight {       // a frozen [out, in] matrix in NF4 + double-quantised absmax
  Tensor codes;          // u8 [out*in/2]
  Tensor absmax_codes;   // u8 [out*in/64]
  Tensor absmax_scales;  // f32 [ceil(out*in/64/256)]
  float absmax_mean = 0; // the offset subtracted before the 8-bit quantisation
  Shape shape;           // {out, in}
  std::int64_t bytes() const;  // exactly what the three tensors hold
};

// w [out, in], any float dtype, CPU/CUDA/meta (meta: storage of the right bytes, nothing computed). The three
// tensors are allocated under MemoryCategory::parameters on w's device.
Nf4Weight nf4_quantize(const Tensor& w);
// The whole [out, in] matrix in dtype (f32 or bf16), on the weight's device (tests, merging).
Tensor nf4_dequantize(const Nf4Weight& q, DType dtype);
// y [..., out] = x [..., in] W^T + bias, W dequantised into x's dtype (f32 or bf16) a block of rows at a time
// (workspace), each tile multiplied by the backend's GEMM. Differentiable w.r.t. x and bias; W is frozen.
Tensor nf4_linear(const Tensor& x, const Nf4Weight& w, const Tensor& bias = Tensor());

namespace detail {
// Rows of W per dequantised tile: at least `target`, and a whole number of 64-blocks (in * rows % 64 == 0).
std::int64_t nf4_tile_rows(std::int64_t in, std::int64_t target);
}  // namespace detail

}  // namespace memtrain::ops
