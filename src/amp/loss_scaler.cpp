// DynamicLossScaler: in-place unscaling with a finiteness verdict, the backoff/growth rule, state round trip.
#include "memtrain/amp/loss_scaler.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/float_types.h"
#include "memtrain/cuda/convert.h"
#include "memtrain/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <type_traits>

namespace memtrain::amp {
namespace {

constexpr const char* kWho = "DynamicLossScaler";

double widen(double x) { return x; }
double widen(float x) { return x; }
double widen(Half x) { return x.to_float(); }
double widen(BFloat16 x) { return x.to_float(); }

template <typename T>
T narrow(double x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(x);
  else return T::from_double(x);
}

// Divides n contiguous elements by scale in f64, rounding once to T; true when every result is finite.
template <typename T>
bool unscale_contiguous(T* p, std::int64_t n, double scale) {
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    const T y = narrow<T>(widen(p[i]) / scale);
    p[i] = y;
    bad |= !std::isfinite(widen(y));
  }
  return bad == 0;
}

bool unscale_cpu_contiguous(const Tensor& g, double scale) {
  const std::int64_t n = g.numel();
  switch (g.dtype()) {
    case DType::f64: return unscale_contiguous(g.data<double>(), n, scale);
    case DType::f32: return unscale_contiguous(g.data<float>(), n, scale);
    case DType::f16: return unscale_contiguous(g.data<Half>(), n, scale);
    case DType::bf16: return unscale_contiguous(g.data<BFloat16>(), n, scale);
    default: break;
  }
  detail::throw_error(kWho, fmt::format("unscale_: unsupported dtype {}", dtype_name(g.dtype())));
}

// Contiguous f32/bf16/f16 gradients on CUDA are unscaled where they live: multiplied by 1 / scale (ops::mul_;
// equal to the CPU's division whenever the scale is a power of two, as the default growth and backoff keep
// it), then checked by their max |g| (cuda::amax: NaN when any element is NaN, Inf when any is Inf), one
// float per gradient read back in one copy per device.
bool unscale_on_device(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

bool unscale_cuda(const std::vector<Tensor>& grads, double scale) {
  std::map<int, std::vector<Tensor>> by_device;
  for (const Tensor& g : grads) by_device[g.device().index].push_back(g);
  bool finite = true;
  for (auto& [index, list] : by_device) {
    const Device device = Device::cuda(index);
    CategoryGuard category(MemoryCategory::workspace);
    const Tensor amaxes = Tensor::empty({static_cast<std::int64_t>(list.size())}, DType::f32, device);
    for (std::size_t i = 0; i < list.size(); ++i) {
      Tensor g = list[i];
      ops::mul_(g, 1.0 / scale);
      cuda::amax(g.data_ptr(), g.dtype(), static_cast<std::size_t>(g.numel()), amaxes.data<float>() + i, index);
    }
    const Tensor host = amaxes.to(Device::cpu());
    for (std::size_t i = 0; i < list.size(); ++i) finite &= std::isfinite(host.data<float>()[i]);
  }
  return finite;
}

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
  bool finite = true;
  std::vector<Tensor> on_device;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    if (g.device().is_cuda() && g.is_contiguous() && unscale_on_device(g.dtype()) && g.numel() > 0) {
      on_device.push_back(g);
      continue;
    }
    if (g.device().is_cpu() && g.is_contiguous()) {
      finite &= unscale_cpu_contiguous(g, scale_);
      continue;
    }
    CategoryGuard category(MemoryCategory::workspace);
    Tensor work = g.to(Device::cpu()).contiguous();
    finite &= unscale_cpu_contiguous(work, scale_);
    Tensor target = g;
    target.copy_(work);
  }
  if (!on_device.empty()) finite &= unscale_cuda(on_device, scale_);
  return finite;
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
