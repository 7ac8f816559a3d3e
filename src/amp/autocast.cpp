// amp::Autocast: a thread-local compute dtype and the cache of parameter copies for the outermost guard.
#include "memtrain/amp/autocast.h"

#include "amp/autocast_state.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <unordered_map>

namespace memtrain::amp {

namespace {

// Parameter copies of one guard, keyed by the parameter's TensorImpl (the same leaf is the same tensor for
// the whole forward; the entry holds the leaf too, so the key cannot be reused by another tensor meanwhile).
struct WeightCache {
  struct Entry {
    Tensor source, copy;
  };
  struct Fp8Entry {
    Tensor source;
    Fp8Weight copy;
  };
  std::unordered_map<const TensorImpl*, Entry> entries;
  std::unordered_map<const TensorImpl*, Fp8Entry> fp8_entries;
};

struct State {
  AutocastMode mode;
  std::shared_ptr<WeightCache> cache;
};

thread_local State t_state;

bool is_parameter(const Tensor& t) { return t.requires_grad() && t.is_leaf(); }

Tensor cast_parameter(const Tensor& p, DType dtype) {
  WeightCache& cache = *t_state.cache;
  auto it = cache.entries.find(&p.impl());
  if (it != cache.entries.end() && it->second.copy.dtype() == dtype) return it->second.copy;
  CategoryGuard category(MemoryCategory::compute_weights);
  Tensor copy = p.to(dtype);
  cache.entries[&p.impl()] = {p, copy};
  return copy;
}

const Fp8Weight& fp8_weight(const Tensor& w) {
  WeightCache& cache = *t_state.cache;
  auto it = cache.fp8_entries.find(&w.impl());
  if (it != cache.fp8_entries.end()) return it->second.copy;
  Fp8State& fp8 = *t_state.mode.fp8;
  CategoryGuard category(MemoryCategory::compute_weights);
  Fp8Weight q = quantize_weight(w.detach(), fp8.recipe(), fp8.meta_for(w));
  return cache.fp8_entries.emplace(&w.impl(), WeightCache::Fp8Entry{w, std::move(q)}).first->second.copy;
}

std::optional<std::vector<Tensor>> cast_floating(const std::vector<Tensor>& inputs, DType dtype, bool use_cache) {
  bool changed = false;
  for (const Tensor& t : inputs) changed |= t.defined() && is_floating(t.dtype()) && t.dtype() != dtype;
  if (!changed) return std::nullopt;
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    if (!t.defined() || !is_floating(t.dtype()) || t.dtype() == dtype) out.push_back(t);
    else if (use_cache && is_parameter(t)) out.push_back(cast_parameter(t, dtype));
    else out.push_back(t.to(dtype));
  }
  return out;
}

}  // namespace

struct Autocast::Saved {
  State state;
};

Autocast::Autocast(const AutocastMode& mode) : previous_(std::make_unique<Saved>(Saved{t_state})) {
  MT_CHECK(mode.dtype == DType::bf16 || mode.dtype == DType::f16 || mode.dtype == DType::f32, "amp::Autocast",
           "the compute dtype must be bf16 or f16 (or f32 to turn autocast off), got {}", dtype_name(mode.dtype));
  MT_CHECK(mode.fp8 == nullptr || mode.dtype == DType::bf16, "amp::Autocast", "the fp8 policy computes in bf16, not {}",
           dtype_name(mode.dtype));
  // A guard that changes the mode starts its own cache; one that repeats it shares the outer cache.
  const bool same = mode.dtype == t_state.mode.dtype && mode.fp8 == t_state.mode.fp8;
  if (!same || !t_state.cache) t_state = State{mode, std::make_shared<WeightCache>()};
}

Autocast::Autocast(DType dtype) : Autocast(AutocastMode{dtype, nullptr}) {}

Autocast::Autocast(Fp8State& fp8) : Autocast(AutocastMode{DType::bf16, &fp8}) {}

Autocast::~Autocast() { t_state = std::move(previous_->state); }

DType autocast_dtype() { return t_state.mode.dtype; }

AutocastMode autocast_mode() { return t_state.mode; }

namespace detail {

std::optional<std::vector<Tensor>> autocast_to_compute(const std::vector<Tensor>& inputs) {
  if (t_state.mode.dtype == DType::f32) return std::nullopt;
  return cast_floating(inputs, t_state.mode.dtype, true);
}

std::optional<Tensor> autocast_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (t_state.mode.fp8 == nullptr) return std::nullopt;
  // Checked before the weight is quantized and cached: fp8_linear runs on the CPU or on one CUDA device.
  MT_CHECK(x.device() == weight.device(), "linear",
           "the fp8 policy needs the input and the weight on one device (input on {}, weight on {})", x.device().str(),
           weight.device().str());
  Fp8State& fp8 = *t_state.mode.fp8;
  const Fp8Weight& wq = fp8_weight(weight);
  const Tensor xb = x.dtype() == DType::bf16 ? x : x.to(DType::bf16);
  Autocast off(DType::f32);  // fp8_linear computes its products in f32 itself
  return fp8_linear(xb, weight, wq, bias, fp8.recipe(), fp8.meta_for(weight));
}

std::optional<std::vector<Tensor>> autocast_to_f32(const std::vector<Tensor>& inputs) {
  if (t_state.mode.dtype == DType::f32) return std::nullopt;
  return cast_floating(inputs, DType::f32, false);
}

}  // namespace detail

}  // namespace memtrain::amp
