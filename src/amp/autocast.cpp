// amp::Autocast: a CastMode (ops/dispatch_modes.h) per guard, holding the compute dtype and the cache of
// parameter copies it shares with the guards around it.
#include "memtrain/amp/autocast.h"

#include "memtrain/amp/fp8_state.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/ops/dispatch_modes.h"

#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace memtrain::amp {

namespace {

// Parameter copies of one guard, keyed by the parameter's TensorImpl (the same leaf is the same tensor for
// the whole forward; the entry holds the leaf too, so the key cannot be reused by another tensor meanwhile).
// Under WeightCasts::recast an entry refers to its copy weakly (the copy dies with its last use) and the copy's
// storage leads to how it was made, so a save of the copy, or of a view of it, can be remade from the parameter;
// under keep_for_backward the entry holds the copy. FP8 copies are handled alike, their codes remade and their
// scales (one float per 128 x 128 tile, or one per tensor) kept.
struct WeightCache {
  struct Entry {
    Tensor source;
    Tensor kept;                     // keep_for_backward
    std::weak_ptr<TensorImpl> copy;  // either policy
    const Storage* origin = nullptr;  // recast: the copy's key in `origins`
    Tensor live_copy() const { return kept.defined() ? kept : Tensor(copy.lock()); }
  };
  struct Fp8Entry {
    Fp8Weight kept;                    // keep_for_backward: the whole copy; recast: all but the codes
    std::weak_ptr<TensorImpl> codes;   // recast
    const Storage* origin = nullptr;   // recast: the codes' key in `origins`
    std::optional<Fp8Weight> live_copy() const {
      if (kept.codes.defined()) return kept;
      Tensor c(codes.lock());
      if (!c.defined()) return std::nullopt;
      Fp8Weight w = kept;
      w.codes = c;
      return w;
    }
  };
  // A live copy's storage, and how to make the whole copy again.
  struct CopyOrigin {
    std::weak_ptr<Storage> storage;  // tells the copy's storage apart from a later one at the same address
    std::function<Tensor()> make;
  };
  std::unordered_map<const TensorImpl*, Entry> entries;
  std::unordered_map<const TensorImpl*, Fp8Entry> fp8_entries;
  std::unordered_map<const Storage*, CopyOrigin> origins;  // recast only

  // Registers `copy` (recast) and returns its key; forgets `previous`, the key of a copy that died.
  const Storage* remember(const Tensor& copy, std::function<Tensor()> make, const Storage* previous) {
    if (previous != nullptr) {
      auto o = origins.find(previous);
      if (o != origins.end() && o->second.storage.expired()) origins.erase(o);
    }
    origins[copy.storage().get()] = {copy.storage(), std::move(make)};
    return copy.storage().get();
  }
};

bool is_parameter(const Tensor& t) { return t.requires_grad() && t.is_leaf(); }

// What an Autocast guard installs as the ops' CastMode (ops/dispatch_modes.h): its mode and the parameter
// copies it shares with the guards around it that set the same mode.
class AutocastCastMode final : public ops::CastMode, public autograd::TensorRemaker {
 public:
  AutocastCastMode(const AutocastMode& mode, std::shared_ptr<WeightCache> cache)
      : mode_(mode), cache_(std::move(cache)) {}

  const AutocastMode& mode() const { return mode_; }
  const std::shared_ptr<WeightCache>& cache() const { return cache_; }

  // Floating tensors cast to the compute dtype (parameters through the guard's cache); others unchanged.
  std::optional<std::vector<Tensor>> to_compute(const std::vector<Tensor>& inputs) override {
    return cast_floating(inputs, mode_.dtype, true);
  }
  std::optional<DType> compute_dtype() const override { return mode_.dtype; }
  // Floating tensors of another dtype cast to f32.
  std::optional<std::vector<Tensor>> to_f32(const std::vector<Tensor>& inputs) override {
    return cast_floating(inputs, DType::f32, false);
  }
  // Under the fp8 policy: amp::fp8_linear of x (cast to bf16) with the guard's FP8 copy of weight.
  std::optional<Tensor> linear(const Tensor& x, const Tensor& weight, const Tensor& bias) override;
  // A pair of the compute dtype and f32 (h + pos): the f32 operand cast down (a parameter through the cache),
  // so the residual stream stays narrow. Any other pair is not promoted.
  std::optional<std::vector<Tensor>> promote(const std::vector<Tensor>& inputs) override {
    bool compute = false, f32 = false;
    for (const Tensor& t : inputs) {
      if (!t.defined()) continue;
      if (t.dtype() == mode_.dtype) compute = true;
      else if (t.dtype() == DType::f32) f32 = true;
      else return std::nullopt;
    }
    if (!compute || !f32) return std::nullopt;
    return cast_floating(inputs, mode_.dtype, true);
  }
  // recast: a save of a parameter's live copy (or a view of it) becomes a recipe that casts the parameter again.
  std::function<Tensor()> recipe(const Tensor& tensor) override;

 private:
  Tensor cast_parameter(const Tensor& p, DType dtype);
  Fp8Weight fp8_weight(const Tensor& w);
  std::optional<std::vector<Tensor>> cast_floating(const std::vector<Tensor>& inputs, DType dtype, bool use_cache);

  AutocastMode mode_;
  std::shared_ptr<WeightCache> cache_;
};

Tensor AutocastCastMode::cast_parameter(const Tensor& p, DType dtype) {
  WeightCache& cache = *cache_;
  auto it = cache.entries.find(&p.impl());
  if (it != cache.entries.end()) {
    Tensor copy = it->second.live_copy();
    if (copy.defined() && copy.dtype() == dtype) return copy;
  }
  CategoryGuard category(MemoryCategory::compute_weights);
  Tensor copy = p.to(dtype);
  WeightCache::Entry entry{p, Tensor(), copy.impl_ptr()};
  if (mode_.weight_casts == WeightCasts::keep_for_backward) {
    entry.kept = copy;
  } else {
    entry.origin = cache.remember(copy, [p, dtype] { return p.detach().to(dtype); },
                                  it == cache.entries.end() ? nullptr : it->second.origin);
  }
  cache.entries[&p.impl()] = std::move(entry);
  return copy;
}

std::function<Tensor()> AutocastCastMode::recipe(const Tensor& tensor) {
  auto it = cache_->origins.find(tensor.storage().get());
  if (it == cache_->origins.end()) return {};
  if (it->second.storage.expired()) {  // a dead copy's address, now another tensor's
    cache_->origins.erase(it);
    return {};
  }
  // The copy was made by make(), so making it again lays the values out in the same storage geometry; the saved
  // view is taken of the new storage at the same shape, strides and offset.
  return [make = it->second.make, dtype = tensor.dtype(), shape = tensor.shape(), strides = tensor.strides(),
          offset = tensor.offset()] {
    CategoryGuard category(MemoryCategory::compute_weights);
    const Tensor copy = make();
    return Tensor::make_view(copy.storage(), shape, strides, offset, dtype);
  };
}

Fp8Weight AutocastCastMode::fp8_weight(const Tensor& w) {
  WeightCache& cache = *cache_;
  auto it = cache.fp8_entries.find(&w.impl());
  if (it != cache.fp8_entries.end()) {
    if (std::optional<Fp8Weight> live = it->second.live_copy()) return *live;
  }
  Fp8State& fp8 = *mode_.fp8;
  Fp8LinearMeta* meta = fp8.meta_for(w);
  const float scale = meta != nullptr ? meta->weight.scale() : 0.0f;  // what a delayed quantization uses
  CategoryGuard category(MemoryCategory::compute_weights);
  Fp8Weight q = quantize_weight(w.detach(), fp8.recipe(), meta);
  WeightCache::Fp8Entry entry{q, q.codes.impl_ptr()};
  if (mode_.weight_casts == WeightCasts::recast) {
    entry.kept.codes = Tensor();
    entry.origin = cache.remember(q.codes, [w, recipe = fp8.recipe(), scale] {
      return quantize_weight_codes_again(w, recipe, scale);
    }, it == cache.fp8_entries.end() ? nullptr : it->second.origin);
  }
  cache.fp8_entries[&w.impl()] = std::move(entry);
  return q;
}

// nullopt when nothing needed a cast, so the op runs as called.
std::optional<std::vector<Tensor>> AutocastCastMode::cast_floating(const std::vector<Tensor>& inputs, DType dtype,
                                                                   bool use_cache) {
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

std::optional<Tensor> AutocastCastMode::linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (mode_.fp8 == nullptr) return std::nullopt;
  // Checked before the weight is quantized and cached: fp8_linear runs on the CPU or on one CUDA device.
  MT_CHECK(x.device() == weight.device(), "linear",
           "the fp8 policy needs the input and the weight on one device (input on {}, weight on {})", x.device().str(),
           weight.device().str());
  Fp8State& fp8 = *mode_.fp8;
  const Fp8Weight wq = fp8_weight(weight);
  const Tensor xb = x.dtype() == DType::bf16 ? x : x.to(DType::bf16);
  Autocast off(DType::f32);  // fp8_linear computes its products in f32 itself
  return fp8_linear(xb, weight, wq, bias, fp8.recipe(), fp8.meta_for(weight));
}

// The innermost guard's mode when it is an Autocast's; nullptr when casting is off or another CastMode is
// installed.
const AutocastCastMode* current() { return dynamic_cast<const AutocastCastMode*>(ops::detail::current_cast_mode()); }

}  // namespace

// An autocast-off guard (f32) installs no mode: the ops then run as called, exactly as with no guard. It leaves
// the remaker as it was: the saves of ops inside it (fp8_linear's, under the fp8 policy) may still be of the
// outer guard's copies.
struct Autocast::Installed {
  std::unique_ptr<AutocastCastMode> mode;  // declared first: outlives the guards that install it
  ops::CastModeGuard guard;
  std::optional<autograd::TensorRemakerGuard> remaker;  // recast: saves of parameter copies become recipes
  explicit Installed(std::unique_ptr<AutocastCastMode> m) : mode(std::move(m)), guard(mode.get()) {
    if (mode) remaker.emplace(mode->mode().weight_casts == WeightCasts::recast ? mode.get() : nullptr);
  }
};

namespace {

// A guard that repeats the innermost guard's mode shares its cache (a tied embedding and head cast once per
// outermost guard); one that changes the mode starts its own.
std::unique_ptr<AutocastCastMode> make_mode(const AutocastMode& mode) {
  if (mode.dtype == DType::f32) return nullptr;
  const AutocastCastMode* outer = current();
  const bool same = outer && mode.dtype == outer->mode().dtype && mode.fp8 == outer->mode().fp8 &&
                    mode.weight_casts == outer->mode().weight_casts;
  return std::make_unique<AutocastCastMode>(mode, same ? outer->cache() : std::make_shared<WeightCache>());
}

}  // namespace

Autocast::Autocast(const AutocastMode& mode) {
  MT_CHECK(mode.dtype == DType::bf16 || mode.dtype == DType::f16 || mode.dtype == DType::f32, "amp::Autocast",
           "the compute dtype must be bf16 or f16 (or f32 to turn autocast off), got {}", dtype_name(mode.dtype));
  MT_CHECK(mode.fp8 == nullptr || mode.dtype == DType::bf16, "amp::Autocast", "the fp8 policy computes in bf16, not {}",
           dtype_name(mode.dtype));
  installed_ = std::make_unique<Installed>(make_mode(mode));
}

Autocast::Autocast(DType dtype) : Autocast(AutocastMode{dtype, nullptr}) {}

Autocast::Autocast(Fp8State& fp8) : Autocast(AutocastMode{DType::bf16, &fp8}) {}

Autocast::~Autocast() = default;

AutocastMode autocast_mode() {
  const AutocastCastMode* mode = current();
  return mode ? mode->mode() : AutocastMode{};
}

DType autocast_dtype() { return autocast_mode().dtype; }

}  // namespace memtrain::amp
