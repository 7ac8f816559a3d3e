// Precision policies: what TrainerConfig.precision and the examples' --precision name.
//   fp32  everything in f32.
//   bf16  f32 master weights (the optimizer's), bf16 compute copies and stored activations under
//         amp::Autocast; no loss scaling (bf16 has f32's exponent range).
//   fp16  the same in f16, plus a dynamic loss scaler (amp/loss_scaler.h): f16 gradients underflow without it.
//   fp8   matmul inputs in FP8 (E4M3 forward, E5M2 gradients) with delayed or blockwise scaling (amp/fp8.h);
//         bf16 everywhere else.
// Parameter storage (TrainerConfig.param_dtype), apart from the compute precision:
//   f32         f32 weights: the optimizer's master copy.
//   bf16        bf16 weights, no master: the optimizer computes in f32 and rounds back stochastically
//               (optim::NarrowParams), 2 bytes per parameter instead of 4.
//   bf16-kahan  the same, rounded to nearest with a bf16 Kahan compensation (2 more bytes per parameter).
// Weight casts (TrainerConfig.weight_casts): how long autocast keeps the compute copies of f32 weights
// (amp/autocast.h): recast (backward casts a weight again when it needs the copy) or keep (for backward).
#pragma once

#include "memtrain/core/dtype.h"

#include <string>
#include <string_view>

namespace memtrain::amp {

enum class Precision { fp32, bf16, fp16, fp8 };

// "fp32", "bf16", "fp16", "fp8"; anything else throws, listing the known names.
Precision parse_precision(std::string_view name);
std::string precision_name(Precision p);

// The dtype activations and compute copies of weights are stored in: f32, bf16, f16, and bf16 for fp8
// (only matmul inputs are FP8).
DType activation_dtype(Precision p);

enum class ParamDtype { f32, bf16, bf16_kahan };

// "f32", "bf16", "bf16-kahan"; anything else throws, listing the known names.
ParamDtype parse_param_dtype(std::string_view name);
std::string param_dtype_name(ParamDtype d);
// The dtype parameters are stored in: f32, or bf16 for both narrow kinds.
DType param_storage_dtype(ParamDtype d);

enum class WeightCasts { recast, keep_for_backward };

// "recast", "keep"; anything else throws, listing the known names.
WeightCasts parse_weight_casts(std::string_view name);
std::string weight_casts_name(WeightCasts casts);

}  // namespace memtrain::amp
