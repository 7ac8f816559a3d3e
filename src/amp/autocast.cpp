// amp::Autocast: a thread-local compute dtype and the cache of parameter copies for the outermost guard.
#include "memtrain/amp/autocast.h"

#include "amp/autocast_state.h"
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
  std::unordered_map<const TensorImpl*, Entry> entries;
};

struct State {
  DType dtype = DType::f32;
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

Autocast::Autocast(DType dtype) : previous_(std::make_unique<Saved>(Saved{t_state})) {
  MT_CHECK(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32, "amp::Autocast",
           "the compute dtype must be bf16 or f16 (or f32 to turn autocast off), got {}", dtype_name(dtype));
  // A guard that changes the dtype starts its own cache; one that repeats it shares the outer cache.
  if (dtype != t_state.dtype || !t_state.cache) t_state = State{dtype, std::make_shared<WeightCache>()};
}

Autocast::~Autocast() { t_state = std::move(previous_->state); }

DType autocast_dtype() { return t_state.dtype; }

namespace detail {

std::optional<std::vector<Tensor>> autocast_to_compute(const std::vector<Tensor>& inputs) {
  if (t_state.dtype == DType::f32) return std::nullopt;
  return cast_floating(inputs, t_state.dtype, true);
}

std::optional<std::vector<Tensor>> autocast_to_f32(const std::vector<Tensor>& inputs) {
  if (t_state.dtype == DType::f32) return std::nullopt;
  return cast_floating(inputs, DType::f32, false);
}

}  // namespace detail

}  // namespace memtrain::amp
