// FP8 formats and delayed scaling (amp/fp8.h): Fp8TensorMeta's amax ring and TE's scale update rule.
#include "memtrain/amp/fp8.h"

#include "memtrain/core/error.h"

#include <cmath>
#include <limits>

namespace memtrain::amp {

DType fp8_dtype(Fp8Format f) { return f == Fp8Format::e4m3 ? DType::f8_e4m3 : DType::f8_e5m2; }

float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

Fp8TensorMeta::Fp8TensorMeta(Fp8Format format, DelayedScalingOptions options) : format_(format), options_(options) {
  MT_CHECK(options.history_len >= 1, "amp::Fp8TensorMeta", "history_len must be >= 1, got {}", options.history_len);
  // 2^64 keeps fp8_max / amax / 2^margin meaningful; TE's recipes use margins of a few units.
  MT_CHECK(options.margin >= 0 && options.margin <= 64, "amp::Fp8TensorMeta", "margin must be in [0, 64], got {}",
           options.margin);
  amax_history_.assign(static_cast<std::size_t>(options.history_len), 0.0f);
}

void Fp8TensorMeta::record_amax(float amax) {
  MT_CHECK(!(amax < 0.0f), "amp::Fp8TensorMeta::record_amax", "amax must be >= 0 (or Inf / NaN), got {}", amax);
  float& slot = amax_history_[current_];
  if (std::isnan(amax) || amax > slot) slot = amax;  // a NaN slot stays NaN: nothing compares greater
}

void Fp8TensorMeta::update_scale() {
  float amax = amax_history_[current_];
  if (options_.algo == AmaxAlgorithm::max) {
    for (const float a : amax_history_) {
      if (std::isnan(a) || a > amax) amax = a;  // NaN wins, as torch.max
      if (std::isnan(amax)) break;
    }
  }
  if (std::isfinite(amax) && amax > 0.0f) {
    // Two f32 roundings, in TE's order; the division by 2^margin is exact unless the result is subnormal.
    const float s = fp8_max(format_) / amax / std::ldexp(1.0f, options_.margin);
    // A tiny amax overflows the scale: TE clamps it to the largest float.
    scale_ = std::isinf(s) ? std::numeric_limits<float>::max() : s;
    inv_scale_ = 1.0f / scale_;
  }
  current_ = (current_ + 1) % amax_history_.size();
  amax_history_[current_] = 0.0f;
}

std::vector<float> Fp8TensorMeta::amax_history() const {
  std::vector<float> out;
  out.reserve(amax_history_.size());
  for (std::size_t k = 1; k <= amax_history_.size(); ++k) {
    out.push_back(amax_history_[(current_ + k) % amax_history_.size()]);
  }
  return out;
}

void Fp8TensorMeta::save(std::map<std::string, Tensor>& out, const std::string& key) const {
  const std::vector<float> history = amax_history();
  out[key + ".amax_history"] = from_buffer(history.data(), {static_cast<std::int64_t>(history.size())}, DType::f32,
                                          DType::f32);
  const float scales[2] = {scale_, inv_scale_};
  out[key + ".scale"] = from_buffer(scales, {2}, DType::f32, DType::f32);
}

void Fp8TensorMeta::load(const std::map<std::string, Tensor>& in, const std::string& key) {
  constexpr const char* where = "amp::Fp8TensorMeta::load";
  const auto find = [&](const std::string& name, std::int64_t size) {
    auto it = in.find(name);
    MT_CHECK(it != in.end(), where, "missing tensor '{}'", name);
    MT_CHECK(it->second.dtype() == DType::f32 && it->second.shape() == Shape{size}, where,
             "'{}' is {} {}, expected f32 [{}]", name, dtype_name(it->second.dtype()), shape_str(it->second.shape()),
             size);
    return it->second.contiguous();
  };
  const Tensor history = find(key + ".amax_history", static_cast<std::int64_t>(amax_history_.size()));
  const Tensor scales = find(key + ".scale", 2);
  const float scale = scales.data<float>()[0], inv_scale = scales.data<float>()[1];
  MT_CHECK(std::isfinite(scale) && scale > 0.0f && std::isfinite(inv_scale) && inv_scale > 0.0f, where,
           "'{}.scale' holds scale {} and inverse {}; both must be finite and > 0", key, scale, inv_scale);
  amax_history_.assign(history.data<float>(), history.data<float>() + history.numel());
  current_ = amax_history_.size() - 1;  // oldest first: the last entry is the current slot
  scale_ = scale;
  inv_scale_ = inv_scale;
}

}  // namespace memtrain::amp
