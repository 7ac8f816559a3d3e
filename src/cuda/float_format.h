// The kernels' FloatFormat (kernels/convert.cuh) of a DType, for the host files that launch kernels taking
// one (cuda_convert.cpp, cuda_reduce.cpp).
#pragma once

#include "kernels/convert.cuh"
#include "memtrain/core/dtype.h"

#include <optional>

namespace memtrain::cuda::detail {

// nullopt for a dtype no kernel reads as a float (integers, bool). The fp8 formats are included; a caller
// whose kernels take no fp8 refuses them itself.
inline std::optional<FloatFormat> float_format(DType t) {
  switch (t) {
    case DType::f64: return FloatFormat::f64;
    case DType::f32: return FloatFormat::f32;
    case DType::f16: return FloatFormat::f16;
    case DType::bf16: return FloatFormat::bf16;
    case DType::f8_e4m3: return FloatFormat::e4m3;
    case DType::f8_e5m2: return FloatFormat::e5m2;
    default: return std::nullopt;
  }
}

}  // namespace memtrain::cuda::detail
