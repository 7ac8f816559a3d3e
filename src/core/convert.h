// Bulk and single-element conversion between any two of the 11 DTypes (contiguous buffers in host memory).
// In core: Tensor's host-side factories and printing use it, and the CPU backend's copy is built on it.
//
// Rules, one per kind of destination:
//   float types  nearest representable value, ties to even, in ONE rounding step from the exact source value
//                (f64 -> narrow uses from_double; i64 -> narrow rounds to odd first, so never twice-rounded);
//                overflow/Inf/NaN as documented in core/float_types.h (f16/bf16 -> Inf, fp8 saturate).
//   integers     floats truncate toward zero like a C++ cast; NaN -> 0; values outside the integer type's
//                range (including +-Inf) clamp to its min/max. Integer -> integer also clamps (saturates),
//                so every conversion into an integer type follows the one rule: the nearest value in range.
//   bool         nonzero -> true (NaN is nonzero; -0.0 is zero). Any nonzero source byte of a bool reads as
//                true and bools are written as 0 or 1.
#pragma once

#include <cstddef>

#include "memtrain/core/dtype.h"

namespace memtrain::detail {

// dst[i] = src[i] converted, for i < n. src and dst must not overlap (unless src == dst and both types have
// the same size). Same dtype is a memcpy. Runs in parallel (OpenMP) for n >= 1 << 16.
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);

// The element at p, exactly widened to double (i64 beyond 2^53 rounds to nearest).
double read_as_double(const void* p, DType type);

// Stores v converted to `type` at p, by the same rules as convert() from f64.
void write_from_double(void* p, DType type, double v);

}  // namespace memtrain::detail
