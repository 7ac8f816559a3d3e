// DynamicLossScaler: in-place unscaling with a finiteness verdict, the backoff/growth rule, state round trip. The
// unscaling itself is each device's backend's unscale_grads (src/core/backend.h): on meta nothing overflows.
#include "memtrain/amp/loss_scaler.h"

#include "core/backend.h"
#include "memtrain/autograd/grad_mode.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace memtrain::amp {
namespace {

constexpr const char* kWho = "DynamicLossScaler";

bool supported(DType t) { return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16; }

std::string key_of(const std::string& prefix, const char* name) { return fmt::format("{}.{}", prefix, name); }

// The value of the 0-d tensor stored under `key`, checked for presence, dtype and shape.
template <typename T>
T read_scalar(const optim::StateDict& in, const std::string& key) {
  constexpr DType want = dtype_of<T>();
  auto it = in.find(key);
  MT_CHECK(it != in.end(), "DynamicLossScaler::load", "missing key '{}'", key);
  const Tensor& t = it->second;
  MT_CHECK(t.defined() && t.dtype() == want && t.dim() == 0, "DynamicLossScaler::load",
           "key '{}' should be a 0-d {} tensor, got {}", key, dtype_name(want),
           t.defined() ? fmt::format("shape {} {}", shape_str(t.shape()), dtype_name(t.dtype())) : "an undefined tensor");
  autograd::NoGradGuard no_grad;
  return t.to(Device::cpu()).data<T>()[0];
}

}  // namespace

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {
  const auto& o = options_;
  MT_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, kWho, "init_scale must be positive and finite, got {}",
           o.init_scale);
  MT_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, kWho,
           "growth_factor must be finite and > 1, got {}", o.growth_factor);
  MT_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, kWho, "backoff_factor must lie in (0, 1), got {}",
           o.backoff_factor);
  MT_CHECK(o.growth_interval >= 1, kWho, "growth_interval must be >= 1, got {}", o.growth_interval);
  MT_CHECK(o.min_scale > 0, kWho, "min_scale must be > 0, got {}", o.min_scale);
  MT_CHECK(std::isfinite(o.max_scale), kWho, "max_scale must be finite, got {}", o.max_scale);
  MT_CHECK(o.min_scale <= o.init_scale && o.init_scale <= o.max_scale, kWho,
           "need min_scale <= init_scale <= max_scale, got min_scale {} init_scale {} max_scale {}", o.min_scale,
           o.init_scale, o.max_scale);
}

bool DynamicLossScaler::unscale_(const std::vector<Tensor>& grads) {
  // Check every dtype first so that a bad list leaves all gradients as they were.
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    MT_CHECK(!g.defined() || supported(g.dtype()), "DynamicLossScaler::unscale_",
             "gradient {} (shape {}) has dtype {}; expected f64, f32, f16 or bf16", i, shape_str(g.shape()),
             dtype_name(g.dtype()));
  }
  autograd::NoGradGuard no_grad;
  // One call per device, in the order the devices first appear, so a backend can batch its read-backs.
  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& e) { return e.first == g.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {g.device(), {}});
    it->second.push_back(g);
  }
  bool found_inf = false;
  for (const auto& [device, list] : by_device) found_inf |= detail::backend_for(device).unscale_grads(list, scale_);
  return !found_inf;
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    MT_CHECK(scale_ > options_.min_scale, "DynamicLossScaler::update",
             "gradients are non-finite at the minimum loss scale {} (after {} skipped steps): they overflow or "
             "hold NaN in true units, which loss scaling cannot fix (check the loss and the forward pass)",
             scale_, skipped_steps_);
    scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    growth_tracker_ = 0;
    ++skipped_steps_;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    scale_ = std::min(scale_ * options_.growth_factor, options_.max_scale);
    growth_tracker_ = 0;
  }
}

void DynamicLossScaler::save(optim::StateDict& out, const std::string& prefix) const {
  out.insert_or_assign(key_of(prefix, "scale"), tensor<double>({scale_}, {}));
  out.insert_or_assign(key_of(prefix, "growth_tracker"), tensor<std::int64_t>({growth_tracker_}, {}));
  out.insert_or_assign(key_of(prefix, "skipped_steps"), tensor<std::int64_t>({skipped_steps_}, {}));
}

void DynamicLossScaler::load(const optim::StateDict& in, const std::string& prefix) {
  const std::string scale_key = key_of(prefix, "scale");
  const std::string tracker_key = key_of(prefix, "growth_tracker");
  const std::string skipped_key = key_of(prefix, "skipped_steps");
  const double scale = read_scalar<double>(in, scale_key);
  const std::int64_t tracker = read_scalar<std::int64_t>(in, tracker_key);
  const std::int64_t skipped = read_scalar<std::int64_t>(in, skipped_key);
  MT_CHECK(scale >= options_.min_scale && scale <= options_.max_scale, "DynamicLossScaler::load",
           "key '{}' holds scale {}, outside this scaler's [min_scale, max_scale] = [{}, {}]", scale_key, scale,
           options_.min_scale, options_.max_scale);
  MT_CHECK(tracker >= 0 && tracker < options_.growth_interval, "DynamicLossScaler::load",
           "key '{}' holds {}, outside [0, growth_interval = {})", tracker_key, tracker, options_.growth_interval);
  MT_CHECK(skipped >= 0, "DynamicLossScaler::load", "key '{}' holds a negative count {}", skipped_key, skipped);
  scale_ = scale;
  growth_tracker_ = tracker;
  skipped_steps_ = skipped;
}

}  // namespace memtrain::amp
