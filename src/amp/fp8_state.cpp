#include "memtrain/amp/fp8_state.h"

#include "memtrain/core/error.h"

#include <set>

namespace memtrain::amp {

Fp8ScalingKind fp8_scaling_from_name(std::string_view name) {
  if (name == "delayed") return Fp8ScalingKind::delayed;
  if (name == "blockwise") return Fp8ScalingKind::blockwise;
  MT_CHECK(false, "amp::fp8_scaling_from_name", "unknown FP8 scaling '{}' (known: delayed, blockwise)", name);
  return Fp8ScalingKind::blockwise;
}

std::string fp8_scaling_name(Fp8ScalingKind kind) {
  return kind == Fp8ScalingKind::delayed ? "delayed" : "blockwise";
}

Fp8State::Fp8State(Fp8Recipe recipe) : recipe_(std::move(recipe)) {
  // Validates the options now rather than at the first forward.
  if (recipe_.kind == Fp8ScalingKind::delayed) (void)Fp8TensorMeta(Fp8Format::e4m3, recipe_.delayed);
}

Fp8LinearMeta* Fp8State::meta_for(const Tensor& weight) {
  if (recipe_.kind != Fp8ScalingKind::delayed) return nullptr;
  auto it = metas_.find(&weight.impl());
  if (it == metas_.end()) it = metas_.emplace(&weight.impl(), Entry{weight.impl_ptr(), Fp8LinearMeta(recipe_.delayed)}).first;
  return &it->second.meta;
}

void Fp8State::update_scales() {
  for (auto& [key, entry] : metas_) entry.meta.update_scales();
}

std::vector<double> Fp8State::step_amaxes(const std::vector<Tensor>& weights) const {
  std::vector<double> out;
  for (const Tensor& w : weights) {
    const auto it = metas_.find(&w.impl());
    if (it == metas_.end()) continue;
    const Fp8LinearMeta& m = it->second.meta;
    for (const Fp8TensorMeta* role : {&m.input, &m.weight, &m.grad}) out.push_back(role->step_amax());
  }
  return out;
}

void Fp8State::merge_step_amaxes(const std::vector<Tensor>& weights, const std::vector<double>& all_ranks) {
  std::vector<Fp8TensorMeta*> roles;
  for (const Tensor& w : weights) {
    const auto it = metas_.find(&w.impl());
    if (it == metas_.end()) continue;
    Fp8LinearMeta& m = it->second.meta;
    roles.insert(roles.end(), {&m.input, &m.weight, &m.grad});
  }
  MT_CHECK(!roles.empty() || all_ranks.empty(), "amp::Fp8State::merge_step_amaxes",
           "{} amaxes for no layer with scaling state", all_ranks.size());
  if (roles.empty()) return;
  MT_CHECK(all_ranks.size() % roles.size() == 0, "amp::Fp8State::merge_step_amaxes",
           "{} amaxes are not whole lists of this state's {} (a rank with other FP8 layers?)", all_ranks.size(),
           roles.size());
  for (std::size_t i = 0; i < all_ranks.size(); ++i)
    roles[i % roles.size()]->record_amax(static_cast<float>(all_ranks[i]));
}

void Fp8State::save(std::map<std::string, Tensor>& out, const std::string& prefix, const NamedWeights& weights) const {
  for (const auto& [name, w] : weights) {
    auto it = metas_.find(&w.impl());
    if (it != metas_.end()) it->second.meta.save(out, prefix + "." + name);
  }
}

void Fp8State::load(const std::map<std::string, Tensor>& in, const std::string& prefix, const NamedWeights& weights) {
  constexpr const char* where = "amp::Fp8State::load";
  std::unordered_map<const TensorImpl*, Entry> loaded;
  std::set<std::string> used;
  for (const auto& [name, w] : weights) {
    const std::string key = prefix + "." + name;
    if (in.count(key + ".input.amax_history") == 0) continue;
    Fp8LinearMeta meta(recipe_.delayed);
    meta.load(in, key);
    for (const char* role : {".input", ".weight", ".grad"})
      for (const char* part : {".amax_history", ".scale"}) used.insert(key + role + part);
    loaded.emplace(&w.impl(), Entry{w.impl_ptr(), std::move(meta)});
  }
  for (auto it = in.lower_bound(prefix + "."); it != in.end() && it->first.rfind(prefix + ".", 0) == 0; ++it) {
    MT_CHECK(used.count(it->first) != 0, where,
             "'{}' is FP8 scaling state of no weight of this model (a checkpoint of another model?)", it->first);
  }
  metas_ = std::move(loaded);
}

std::size_t Fp8State::bytes() const {
  std::size_t total = 0;
  for (const auto& [key, entry] : metas_) total += entry.meta.bytes();
  return total;
}

}  // namespace memtrain::amp
