#include "memtrain/amp/precision.h"

#include "memtrain/core/error.h"

namespace memtrain::amp {

Precision parse_precision(std::string_view name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "fp16") return Precision::fp16;
  if (name == "fp8") return Precision::fp8;
  MT_CHECK(false, "amp::parse_precision", "unknown precision '{}' (known: fp32, bf16, fp16, fp8)", name);
  return Precision::fp32;
}

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}

DType activation_dtype(Precision p) {
  switch (p) {
    case Precision::fp32: return DType::f32;
    case Precision::fp16: return DType::f16;
    case Precision::bf16:
    case Precision::fp8: return DType::bf16;
  }
  return DType::f32;
}

ParamDtype parse_param_dtype(std::string_view name) {
  if (name == "f32") return ParamDtype::f32;
  if (name == "bf16") return ParamDtype::bf16;
  if (name == "bf16-kahan") return ParamDtype::bf16_kahan;
  MT_CHECK(false, "amp::parse_param_dtype", "unknown parameter dtype '{}' (known: f32, bf16, bf16-kahan)", name);
  return ParamDtype::f32;
}

std::string param_dtype_name(ParamDtype d) {
  switch (d) {
    case ParamDtype::f32: return "f32";
    case ParamDtype::bf16: return "bf16";
    case ParamDtype::bf16_kahan: return "bf16-kahan";
  }
  return "?";
}

DType param_storage_dtype(ParamDtype d) { return d == ParamDtype::f32 ? DType::f32 : DType::bf16; }

WeightCasts parse_weight_casts(std::string_view name) {
  if (name == "recast") return WeightCasts::recast;
  if (name == "keep") return WeightCasts::keep_for_backward;
  MT_CHECK(false, "amp::parse_weight_casts", "unknown weight-cast policy '{}' (known: recast, keep)", name);
  return WeightCasts::recast;
}

std::string weight_casts_name(WeightCasts casts) {
  return casts == WeightCasts::recast ? "recast" : "keep";
}

}  // namespace memtrain::amp
