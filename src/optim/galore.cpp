// GaLore: per-parameter projector + base-rule state; the base rule runs on a zero workspace of the projected
// shape and the projected update is mapped back and added to the parameter with the decoupled decay.
#include "memtrain/optim/galore.h"

#include "core/backend.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/name_glob.h"
#include "memtrain/ops/elementwise.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace memtrain::optim {
namespace {

constexpr const char* kWhere = "GaLore";

}  // namespace

// Spec::make writes the family options into every group; the projected groups get them the same way.
std::pair<std::size_t, std::vector<ParamGroup>> GaLore::merge_groups(const Spec& spec, GaLoreGroups groups) {
  const std::size_t n_projected = groups.projected.size();
  std::vector<ParamGroup> all = std::move(groups.projected);
  for (auto& g : groups.plain) all.push_back(std::move(g));
  for (auto& g : all) {
    g.beta1 = spec.beta1;
    g.beta2 = spec.beta2;
    g.eps = spec.eps;
  }
  return {n_projected, std::move(all)};
}

namespace {

// The hyper-parameters of `group` without its params; weight_decay as given.
ParamGroup hyper_of(const ParamGroup& group, double weight_decay) {
  ParamGroup out;
  out.lr = group.lr;
  out.weight_decay = weight_decay;
  out.beta1 = group.beta1;
  out.beta2 = group.beta2;
  out.eps = group.eps;
  return out;
}

std::string key_of(std::size_t index, const char* name) { return fmt::format("{}.{}", index, name); }

// True when `name`, split at '.', has a component equal to one of the GaLore target module names.
bool under_target_module(std::string_view name) {
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t end = std::min(name.find('.', start), name.size());
    const std::string_view part = name.substr(start, end - start);
    if (part == "attn" || part == "self_attn" || part == "mlp") return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

bool is_galore_target(std::string_view name, const Tensor& param) {
  constexpr std::string_view suffix = ".weight";
  const bool weight = name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  return param.defined() && param.dim() == 2 && weight && under_target_module(name);
}

bool is_galore_target(std::string_view name, const Tensor& param, const std::vector<std::string>& targets) {
  if (targets.empty()) return is_galore_target(name, param);
  if (!param.defined() || param.dim() != 2) return false;
  return std::any_of(targets.begin(), targets.end(),
                     [&](const std::string& pattern) { return name_glob_matches(pattern, name); });
}

std::string describe_matrices(const std::vector<std::pair<std::string, Tensor>>& named, std::size_t max_listed) {
  std::string out;
  std::size_t count = 0;
  for (const auto& [name, t] : named) {
    if (!t.defined() || t.dim() != 2) continue;
    if (count++ < max_listed) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", name, shape_str(t.shape()));
  }
  if (count == 0) return "none";
  if (count > max_listed) out += fmt::format(", and {} more", count - max_listed);
  return out;
}

GaLoreGroups galore_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                           double weight_decay) {
  return galore_groups(named, lr, weight_decay, {});
}

GaLoreGroups galore_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                           double weight_decay, const std::vector<std::string>& targets) {
  ParamGroup projected;
  projected.lr = lr;
  projected.weight_decay = weight_decay;
  std::vector<std::pair<std::string, Tensor>> rest;
  for (const auto& [name, t] : named) {
    MT_CHECK(t.defined(), "galore_groups", "parameter '{}' is an undefined tensor", name);
    if (is_galore_target(name, t, targets)) {
      projected.params.push_back(t);
    } else {
      rest.emplace_back(name, t);
    }
  }
  MT_CHECK(targets.empty() || !projected.params.empty(), "galore_groups",
           "the target patterns [{}] match no 2-D parameter ('*' matches any run of characters, over the whole "
           "name); the 2-D parameters are: {}",
           fmt::join(targets, ", "), describe_matrices(named));
  GaLoreGroups out;
  if (!projected.params.empty()) out.projected.push_back(std::move(projected));
  out.plain = decay_groups(rest, lr, weight_decay);
  return out;
}

GaLore::GaLore(const Spec& base, const GaLoreSpec& galore, GaLoreGroups groups)
    : GaLore(base, galore, merge_groups(base, std::move(groups))) {}

GaLore::GaLore(const Spec& base, const GaLoreSpec& galore, std::pair<std::size_t, std::vector<ParamGroup>> merged)
    : Optimizer(std::move(merged.second)), galore_(galore), name_(fmt::format("galore-{}", kind_name(base.kind))) {
  const std::size_t n_projected = merged.first;
  // The base optimizer over parameter-less copies of the groups checks their hyper-parameters once.
  std::vector<ParamGroup> hypers;
  for (const auto& g : param_groups()) hypers.push_back(hyper_of(g, g.weight_decay));
  rule_ = base.make(std::move(hypers));
  GaLoreProjector check(projector_options(0));  // validates rank, update_gap and the SVD knobs

  std::size_t index = 0;
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    for (const Tensor& p : param_groups()[g].params) {
      Entry entry;
      if (g < n_projected) {
        // The projection runs on the backend of the param's device; this throws naming the device when
        // none serves it (a build without CUDA, an index past the machine's devices).
        ::memtrain::detail::backend_for(p.device());
        MT_CHECK(p.dim() == 2, kWhere, "projected param {} must be a 2-D weight, got shape {}", index,
                 shape_str(p.shape()));
        // bf16: stepped through an f32 copy (Optimizer's NarrowParams), so the projection reads f32 there too.
        MT_CHECK((p.dtype() == DType::f32 || p.dtype() == DType::bf16) && p.is_contiguous(), kWhere,
                 "projected param {} must be contiguous f32 or bf16, got {} of shape {}{}", index, dtype_name(p.dtype()),
                 shape_str(p.shape()), p.is_contiguous() ? "" : " (non-contiguous)");
        MT_CHECK(galore_.rank <= std::min(p.size(0), p.size(1)), kWhere,
                 "rank {} exceeds min(m, n) = {} of projected param {} (shape {})", galore_.rank,
                 std::min(p.size(0), p.size(1)), index, shape_str(p.shape()));
        entry.projector = std::make_unique<GaLoreProjector>(projector_options(index));
      }
      index_.emplace(p.impl_ptr().get(), index);
      entries_.push_back(std::move(entry));
      ++index;
    }
  }
}

void GaLore::key_streams(const std::vector<std::size_t>& stream_index) {
  MT_CHECK(stream_index.size() == entries_.size(), kWhere, "{} stream indices for {} parameters",
           stream_index.size(), entries_.size());
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].projector) continue;
    MT_CHECK(steps_taken(i) == 0, kWhere, "key_streams after parameter {} has stepped", i);
    entries_[i].projector = std::make_unique<GaLoreProjector>(projector_options(stream_index[i]));
  }
}

GaLoreProjectorOptions GaLore::projector_options(std::size_t index) const {
  GaLoreProjectorOptions o = galore_;
  o.seed = galore_.seed + index;  // Philox keys: each parameter its own stream
  return o;
}

std::size_t GaLore::index_of(const Tensor& param) const {
  MT_CHECK(param.defined(), kWhere, "undefined tensor");
  auto it = index_.find(param.impl_ptr().get());
  MT_CHECK(it != index_.end(), kWhere, "tensor of shape {} is not in any parameter group", shape_str(param.shape()));
  return it->second;
}

bool GaLore::is_projected(const Tensor& param) const { return entries_[index_of(param)].projector != nullptr; }

Shape GaLore::projected_shape(const Tensor& param) const {
  MT_CHECK(is_projected(param), kWhere, "param of shape {} is not projected (it is in a plain group)",
           shape_str(param.shape()));
  const std::int64_t m = param.size(0), n = param.size(1);
  return GaLoreProjector::projected_shape(GaLoreProjector::side_for(galore_.proj_type, m, n), m, n, galore_.rank);
}

void GaLore::shard_projected_state(StateShards shards) {
  MT_CHECK(shards.range && shards.gather, kWhere, "shard_projected_state needs both a range and a gather");
  for (const Entry& e : entries_)
    MT_CHECK(e.steps == 0 && e.base.step() == 0, kWhere,
             "shard_projected_state after the first step: the state already covers whole tensors");
  shards_ = std::move(shards);
}

ParamGroup GaLore::range_group(const ParamGroup& group, const Tensor& part, std::int64_t r_numel) {
  ParamGroup hyper = hyper_of(group, 0.0);
  hyper.params = {part};
  hyper.whole_shape = {Shape{r_numel}};
  return hyper;
}

const GaLoreProjector* GaLore::projector(const Tensor& param) const {
  return entries_[index_of(param)].projector.get();
}

// All state lives in entries_ (the base state has R's shape, which the base class cannot know).
void GaLore::init_state(const Tensor&, const ParamGroup&, ParamState&) {}

void GaLore::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState&) {
  const std::size_t index = index_of(param);
  Entry& entry = entries_[index];
  if (!entry.projector) {
    // A bf16 parameter reaches here only when steps_in_slices: the base rule steps it a slice at a time.
    if (param.dtype() == DType::bf16) {
      const NarrowStep narrow = narrow_step(index, param);
      rule_->step_external(param, grad, group, entry.base, /*grad_checked=*/true, &narrow);
    } else {
      rule_->step_external(param, grad, group, entry.base, /*grad_checked=*/true);
    }
    return;
  }
  // R and the workspace below are temporaries: update() runs under MemoryCategory::workspace, and the
  // projector allocates its refreshed basis under optimizer_state itself.
  const Tensor R = entry.projector->project(grad_f32(grad, param.device()), entry.steps);
  step_projected(param, R, group, entry);
}

void GaLore::step_projected(Tensor& param, const Tensor& R, const ParamGroup& group, Entry& entry) {
  // On the parameter's device: the base rule then dispatches to its device kernels, and its state lives there.
  Tensor delta = zeros(R.shape(), DType::f32, param.device());
  // R is finite: G passed the base class's gate and the basis is orthonormal.
  if (!projected_state_sharded()) {
    rule_->step_external(delta, R, hyper_of(group, 0.0), entry.base, /*grad_checked=*/true);
  } else {
    const auto [begin, end] = shards_.range(R.numel());
    if (end > begin) {
      Tensor part = delta.view({R.numel()}).narrow(0, begin, end - begin);
      const Tensor r_part = R.view({R.numel()}).narrow(0, begin, end - begin);
      rule_->step_external(part, r_part, range_group(group, part, R.numel()), entry.base, /*grad_checked=*/true);
    }
    shards_.gather(delta);
  }
  ++entry.steps;
  const float decay = static_cast<float>(1.0 - group.lr * group.weight_decay);
  if (galore_.decay_order == GaLoreDecayOrder::before) {
    entry.projector->project_back_add(delta, param, decay);  // param = param * decay + project_back(delta)
  } else {
    entry.projector->project_back_add(delta, param, 1.0f);  // param += project_back(delta), then decays
    if (decay != 1.0f) ops::mul_(param, decay);
  }
  release_basis(entry);
}

void GaLore::release_basis(const Entry& entry) {
  release_state_pages(entry.projector->left_matrix());
  release_state_pages(entry.projector->right_matrix());
}

bool GaLore::steps_in_slices(std::size_t index) const {
  return !entries_.at(index).projector && rule_->slices_narrow_params();
}

std::int64_t GaLore::steps_taken(std::size_t index) const {
  const Entry& e = entries_.at(index);
  return e.projector ? e.steps : e.base.step();  // what collect_state saves as "<index>.step"
}

const ParamGroup& GaLore::group_of(std::size_t index) const {
  for (const ParamGroup& g : param_groups()) {
    if (index < g.params.size()) return g;
    index -= g.params.size();
  }
  MT_CHECK(false, kWhere, "parameter index {} is past the {} parameters", index, entries_.size());
  return param_groups().front();
}

const Tensor& GaLore::param_of(std::size_t index) const {
  for (const ParamGroup& g : param_groups()) {
    if (index < g.params.size()) return g.params[index];
    index -= g.params.size();
  }
  MT_CHECK(false, kWhere, "parameter index {} is past the {} parameters", index, entries_.size());
  return param_groups().front().params.front();
}

void GaLore::save_sharded(std::size_t i, const Tensor& param, StateDict& out, StateCopy copy) const {
  const Entry& e = entries_[i];
  const auto [begin, end] = shards_.range(shape_numel(projected_shape(param)));
  if (end > begin) {
    rule_->save_external(e.base, std::to_string(i), out, copy);  // its step count is e.steps
  } else {
    out.emplace(key_of(i, "step"), tensor<std::int64_t>({e.steps}, {}));  // no range of R here: the count alone
  }
}

void GaLore::load_sharded(const TensorSource& dict, std::size_t i, const Tensor& param, const ParamGroup& group,
                          std::set<std::string>& used, const std::string& where, Entry& entry) {
  const std::int64_t r_numel = shape_numel(projected_shape(param));
  const auto [begin, end] = shards_.range(r_numel);
  if (end > begin) {
    // A stand-in of the range: init_state reads only its shape, dtype and device (and R's whole size).
    CategoryGuard category(MemoryCategory::workspace);
    const Tensor like = Tensor::empty({end - begin}, DType::f32, param.device());
    entry.base = rule_->load_external(dict, std::to_string(i), like, range_group(group, like, r_numel), used, where);
    entry.steps = entry.base.step();
    return;
  }
  const std::string key = key_of(i, "step");
  const auto info = dict.info(key);
  MT_CHECK(info && shape_numel(info->shape) == 1 && info->dtype == DType::i64, where,
           "key '{}' should hold the step count (one i64) of projected param {}", key, i);
  used.insert(key);
  entry.steps = dict.read(key).contiguous().data<std::int64_t>()[0];
  MT_CHECK(entry.steps >= 0, where, "key '{}' holds a negative step {}", key, entry.steps);
}

GaLore::Entry& GaLore::projected_entry(const Tensor& param, const char* who) {
  Entry& entry = entries_[index_of(param)];
  MT_CHECK(entry.projector != nullptr, who, "param of shape {} is not projected (it is in a plain group)",
           shape_str(param.shape()));
  return entry;
}

void GaLore::accumulate(const Tensor& param, const Tensor& grad) {
  const std::optional<StateArenaGuard> placed = place_state();  // layer-wise: called outside step()
  const char* who = "GaLore::accumulate";
  Entry& entry = projected_entry(param, who);
  MT_CHECK(grad.defined() && grad.shape() == param.shape(), who, "param has shape {} but its grad has shape {}",
           shape_str(param.shape()), grad.defined() ? shape_str(grad.shape()) : std::string("(undefined)"));
  if (entry.skip) return;
  autograd::NoGradGuard no_grad;
  Tensor G;
  {
    CategoryGuard category(MemoryCategory::workspace);
    G = grad_f32(grad, param.device());
  }
  if (!is_finite(G)) {
    entry.skip = true;
    entry.accumulated = Tensor();
    return;
  }
  if (!entry.accumulated.defined()) {
    // The first micro-batch: project() refreshes the basis when this step is a refresh step.
    CategoryGuard category(MemoryCategory::gradients);
    entry.accumulated = entry.projector->project(G, entry.steps);
    return;
  }
  entry.projector->project_add(G, entry.accumulated);
}

bool GaLore::has_accumulated(const Tensor& param) const {
  const Entry& entry = entries_[index_of(param)];
  return entry.accumulated.defined() || entry.skip;
}

Tensor GaLore::projected_gradient(const Tensor& param, const Tensor& grad) {
  const std::optional<StateArenaGuard> placed = place_state();  // layer-wise: called outside step()
  const char* who = "GaLore::projected_gradient";
  Entry& entry = projected_entry(param, who);
  MT_CHECK(grad.defined() || has_accumulated(param), who,
           "param of shape {} has neither a gradient nor an accumulated one", shape_str(param.shape()));
  if (grad.defined()) accumulate(param, grad);
  Tensor R = std::move(entry.accumulated);
  entry.accumulated = Tensor();
  if (entry.skip) R = Tensor();
  entry.skip = false;
  return R;
}

bool GaLore::step_projected_gradient(const Tensor& param, const Tensor& R) {
  const std::optional<StateArenaGuard> placed = place_state();  // layer-wise: called outside step()
  const char* who = "GaLore::step_projected_gradient";
  const std::size_t index = index_of(param);
  Entry& entry = projected_entry(param, who);
  MT_CHECK(entry.projector->side() != GaLoreProjector::Side::unset, who,
           "param of shape {}: no gradient was projected yet (call projected_gradient first)",
           shape_str(param.shape()));
  const Shape want = GaLoreProjector::projected_shape(entry.projector->side(), param.size(0), param.size(1),
                                                      galore_.rank);
  MT_CHECK(R.defined() && R.shape() == want && R.dtype() == DType::f32 && R.device() == param.device() &&
               R.is_contiguous(),
           who, "R must be a contiguous f32 tensor of shape {} on {} for param of shape {}, got {}", shape_str(want),
           param.device().str(), shape_str(param.shape()),
           R.defined() ? fmt::format("{} {} on {}", dtype_name(R.dtype()), shape_str(R.shape()), R.device().str())
                       : "an undefined tensor");
  if (!is_finite(R)) return false;
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::workspace);
  Tensor target = param;
  step_in_f32(index, target, [&] { step_projected(target, R, group_of(index), entry); });
  return true;
}

std::size_t GaLore::accumulator_bytes() const {
  std::size_t total = 0;
  for (const Entry& e : entries_)
    if (e.accumulated.defined()) total += e.accumulated.nbytes();
  return total;
}

StateDict GaLore::collect_state(StateCopy copy) const {
  StateDict out;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.projector && projected_state_sharded()) {
      save_sharded(i, param_of(i), out, copy);
    } else {
      rule_->save_external(e.base, std::to_string(i), out, copy);
    }
    if (!e.projector || e.projector->refresh_count() == 0) continue;
    const GaLoreProjector& proj = *e.projector;
    if (proj.left_matrix().defined()) out.emplace(key_of(i, "galore.left"), collected(proj.left_matrix(), copy));
    if (proj.right_matrix().defined()) out.emplace(key_of(i, "galore.right"), collected(proj.right_matrix(), copy));
    // The Philox seed and offset are u64; they travel bit-cast in an i64 tensor.
    std::int64_t rng[2];
    std::memcpy(&rng[0], &proj.rng_state().seed, sizeof(rng[0]));
    std::memcpy(&rng[1], &proj.rng_state().offset, sizeof(rng[1]));
    out.emplace(key_of(i, "galore.rng"), tensor<std::int64_t>({rng[0], rng[1]}, {2}));
    out.emplace(key_of(i, "galore.refresh_count"), tensor<std::int64_t>({proj.refresh_count()}, {}));
  }
  return out;
}

void GaLore::load_rule_state(const TensorSource& dict) {
  const std::string where = fmt::format("{}::load_state_dict", name());
  std::set<std::string> used;
  std::vector<Entry> fresh(entries_.size());
  // Entries follow the parameter numbering, which walks the groups in order.
  std::size_t i = 0;
  for (const ParamGroup& group : param_groups()) {
    for (const Tensor& param : group.params) {
      Entry& e = fresh[i];
      const std::string prefix = std::to_string(i);
      if (!entries_[i].projector) {
        e.base = rule_->load_external(dict, prefix, param, group, used, where);
        ++i;
        continue;
      }
      e.projector = std::make_unique<GaLoreProjector>(projector_options(i));
      const std::int64_t m = param.size(0), n = param.size(1);
      const auto side = GaLoreProjector::side_for(galore_.proj_type, m, n);
      if (projected_state_sharded()) {
        load_sharded(dict, i, param, group, used, where, e);
      } else {
        // A stand-in of R's shape: init_state reads only its shape, dtype and device.
        CategoryGuard category(MemoryCategory::workspace);
        const Tensor like = Tensor::empty(projected_shape(param), DType::f32, param.device());
        e.base = rule_->load_external(dict, prefix, like, hyper_of(group, 0.0), used, where);
        e.steps = e.base.step();
      }
      if (e.steps > 0) {
        // A side the projector does not keep has no key; a stray one is reported as unexpected below.
        auto take = [&](const char* name, bool wanted) {
          if (!wanted) return Tensor();
          const std::string key = key_of(i, name);
          MT_CHECK(dict.info(key).has_value(), where, "missing key '{}' (projected param {}, shape {})", key, i,
                   shape_str(param.shape()));
          used.insert(key);
          return dict.read(key);
        };
        using Side = GaLoreProjector::Side;
        const Tensor left = take("galore.left", side != Side::right);
        const Tensor right = take("galore.right", side != Side::left);
        const Tensor rng = take("galore.rng", true);
        const Tensor count = take("galore.refresh_count", true);
        MT_CHECK(rng.dtype() == DType::i64 && rng.numel() == 2, where,
                 "key '{}' should hold an i64 [2] (Philox seed, offset), got {} {}", key_of(i, "galore.rng"),
                 shape_str(rng.shape()), dtype_name(rng.dtype()));
        MT_CHECK(count.dtype() == DType::i64 && count.numel() == 1, where,
                 "key '{}' should hold one i64 refresh count, got {} {}", key_of(i, "galore.refresh_count"),
                 shape_str(count.shape()), dtype_name(count.dtype()));
        const Tensor rng_c = rng.contiguous();
        RngState state;
        std::memcpy(&state.seed, rng_c.data<std::int64_t>(), sizeof(state.seed));
        std::memcpy(&state.offset, rng_c.data<std::int64_t>() + 1, sizeof(state.offset));
        e.projector->restore(m, n, left, right, state, count.contiguous().data<std::int64_t>()[0], param.device());
        release_basis(e);
      }
      ++i;
    }
  }
  check_all_used(dict, used, where);
  entries_ = std::move(fresh);
}

std::size_t GaLore::projected_state_bytes() const {
  std::size_t total = 0;
  for (const Entry& e : entries_)
    if (e.projector) total += e.base.bytes();
  return total;
}

std::size_t GaLore::projector_bytes() const {
  std::size_t total = 0;
  for (const Entry& e : entries_)
    if (e.projector) total += e.projector->bytes();
  return total;
}

std::size_t GaLore::plain_state_bytes() const {
  std::size_t total = 0;
  for (const Entry& e : entries_)
    if (!e.projector) total += e.base.bytes();
  return total;
}

void GaLore::reset_state(const Tensor& param) {
  MT_CHECK(false, "GaLore::reset_state", "GaLore cannot free one parameter's state (shape {}): its projected state "
           "lives with a projector that is not rebuilt mid-run", shape_str(param.shape()));
}

Optimizer::StatePlan GaLore::planned_state() const {
  StatePlan plan;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const Tensor& param = param_of(i);
    if (narrow_params().kahan && param.dtype() == DType::bf16) plan.add(param.nbytes());  // its compensation
    if (!entries_[i].projector) {
      ParamGroup twin = group_of(i);
      twin.params = {Tensor::empty(param.shape(), param.dtype(), Device::meta())};
      twin.whole_shape.clear();
      plan.add(rule_->state_plan_of(twin.params.front(), twin));
      continue;
    }
    const std::int64_t m = param.size(0), n = param.size(1);
    const auto side = GaLoreProjector::side_for(galore_.proj_type, m, n);
    const Shape r_shape = projected_shape(param);
    ParamGroup twin = group_of(i);
    twin.params = {Tensor::empty(r_shape, DType::f32, Device::meta())};
    twin.whole_shape.clear();
    plan.add(rule_->state_plan_of(twin.params.front(), twin));
    // The basis: P (m, r) on the left, Q (n, r) on the right, both for the full projection.
    const bool left = side != GaLoreProjector::Side::right, right = side != GaLoreProjector::Side::left;
    const std::int64_t r = left ? r_shape[0] : r_shape[1];
    if (left) plan.add(sizeof(float) * static_cast<std::size_t>(r * m));
    if (right) plan.add(sizeof(float) * static_cast<std::size_t>(r * n));
  }
  return plan;
}

std::size_t GaLore::rule_state_bytes() const {
  return projected_state_bytes() + projector_bytes() + plain_state_bytes();
}

}  // namespace memtrain::optim
