// Optimizer base: parameter slots over groups, lazy state, finite-gradient gate, state_dict round trip.
#include "memtrain/optim/optimizer.h"

#include "core/backend.h"
#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/ops/elementwise.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace memtrain::optim {
namespace {

std::string key_of(const std::string& prefix, const std::string& name) { return fmt::format("{}.{}", prefix, name); }

constexpr const char* kCompensation = "kahan";

}  // namespace

// The rounding stream of one parameter's step: its index above, its step count below (2^40 steps).
std::uint64_t Optimizer::rounding_stream(std::size_t index, std::int64_t step) {
  return (static_cast<std::uint64_t>(index) << 40) | (static_cast<std::uint64_t>(step) & ((std::uint64_t{1} << 40) - 1));
}

// True when every element of `g` is finite, read in f32: the backend's all_finite (on meta always true:
// it reads as zeros).
bool Optimizer::is_finite(const Tensor& g) { return ::memtrain::detail::backend_for(g.device()).all_finite(g); }

Shape whole_shape(const Tensor& param, const ParamGroup& group) {
  if (group.whole_shape.empty()) return param.shape();
  for (std::size_t i = 0; i < group.params.size(); ++i)
    if (group.params[i].impl_ptr() == param.impl_ptr()) return group.whole_shape[i];
  MT_CHECK(false, "Optimizer", "a tensor of shape {} is not in the group", shape_str(param.shape()));
  return {};
}

std::int64_t whole_numel(const Tensor& param, const ParamGroup& group) {
  return shape_numel(whole_shape(param, group));
}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  std::size_t index = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    MT_CHECK(groups_[g].whole_shape.empty() || groups_[g].whole_shape.size() == groups_[g].params.size(),
             "Optimizer", "group {} has {} params but {} whole_shape entries", g, groups_[g].params.size(),
             groups_[g].whole_shape.size());
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      MT_CHECK(p.defined(), "Optimizer", "group {} param {} is an undefined tensor", g, i);
      const bool fresh = slots_.emplace(p.impl_ptr().get(), Slot{g, index, i}).second;
      MT_CHECK(fresh, "Optimizer", "group {} param {} (shape {}) appears more than once", g, i,
               shape_str(p.shape()));
      ++index;
    }
  }
  states_.resize(index);
  compensations_.resize(index);
}

void Optimizer::set_narrow_params(NarrowParams rule) {
  MT_CHECK(rule.slice_elements > 0, "Optimizer::set_narrow_params", "slice_elements must be positive, got {}",
           rule.slice_elements);
  if (rule.kahan != narrow_.kahan) {
    for (const auto& [impl, slot] : slots_) {
      MT_CHECK(param_at(slot).dtype() != DType::bf16 || states_[slot.index].step == 0, "Optimizer::set_narrow_params",
               "bf16 param {} has stepped {} times: Kahan compensation cannot be switched {} mid-run", slot.index,
               states_[slot.index].step, rule.kahan ? "on" : "off");
    }
  }
  narrow_ = rule;
}

const Tensor& Optimizer::param_at_index(std::size_t index) const {
  for (const auto& [impl, slot] : slots_)
    if (slot.index == index) return groups_[slot.group].params[slot.index_in_group];
  MT_CHECK(false, name(), "parameter index {} is past the {} parameters", index, states_.size());
  return groups_.front().params.front();
}

const Optimizer::Slot& Optimizer::slot_of(const Tensor& param) const {
  MT_CHECK(param.defined(), "Optimizer::step_param", "undefined tensor");
  auto it = slots_.find(param.impl_ptr().get());
  MT_CHECK(it != slots_.end(), "Optimizer::step_param", "tensor of shape {} is not in any parameter group",
           shape_str(param.shape()));
  return it->second;
}

Optimizer::Outcome Optimizer::step_slot(const Slot& slot) {
  Tensor& param = param_at(slot);
  const Tensor grad = param.grad();
  if (!grad.defined()) return Outcome::no_grad;
  MT_CHECK(grad.shape() == param.shape(), name(), "param {} has shape {} but its grad has shape {}", slot.index,
           shape_str(param.shape()), shape_str(grad.shape()));
  autograd::NoGradGuard no_grad;
  // The gate runs before any state exists, so a skipped parameter is left exactly as it was.
  if (!is_finite(grad)) return Outcome::nonfinite;
  const ParamGroup& group = groups_[slot.group];
  ParamState& state = states_[slot.index];
  if (param.dtype() == DType::bf16 && steps_in_slices(slot.index)) {
    if (slices_narrow_params()) {  // this rule takes the bf16 parameter itself, a slice at a time
      const NarrowStep narrow = narrow_step(slot.index, param);
      apply_rule(param, grad, group, state, &narrow);
    } else {  // a wrapper (GaLore) hands it on to its rule
      apply_rule(param, grad, group, state);
    }
  } else {
    step_in_f32(slot.index, param, [&] { apply_rule(param, grad, group, state); });
  }
  return Outcome::updated;
}

Optimizer::NarrowStep Optimizer::narrow_step(std::size_t index, const Tensor& param) {
  MT_CHECK(index < compensations_.size(), name(), "parameter index {} is past the {} parameters", index,
           compensations_.size());
  Tensor& compensation = compensations_[index];
  if (narrow_.kahan && !compensation.defined()) {
    CategoryGuard category(MemoryCategory::optimizer_state);
    compensation = zeros(param.shape(), DType::bf16, param.device());
  }
  return {index, narrow_, compensation};
}

namespace {

// f32 copy of a bf16 parameter's value (or slice), plus its Kahan compensation when defined.
Tensor widened(const Tensor& stored, const Tensor& compensation) {
  Tensor wide = stored.to(DType::f32);
  if (compensation.defined()) ops::add_(wide, compensation.to(DType::f32));
  return wide;
}

// The part of state tensor `t` that elements [a, a + len) of an n-element parameter own, for a rule whose state
// is per element or per block of `block` elements (Optimizer::elementwise_block).
Tensor state_slice(const Tensor& t, const std::string& name, std::int64_t n, std::int64_t a, std::int64_t len,
                   std::int64_t block, std::string_view who) {
  const std::int64_t blocks = (n + block - 1) / block;
  MT_CHECK(t.is_contiguous() && (t.numel() == n || t.numel() == blocks), who,
           "state '{}' ({} elements) is neither per element nor per block of {} of a {}-element parameter", name,
           t.numel(), block, n);
  if (t.numel() == n) return t.view({n}).narrow(0, a, len);
  return t.view({blocks}).narrow(0, a / block, (len + block - 1) / block);
}

}  // namespace

void Optimizer::update_narrow(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state,
                              const NarrowStep& narrow) {
  update_in_slices(param, grad, group, state, narrow);
}

void Optimizer::for_each_state_slice(
    const ParamState& state, std::int64_t n, std::int64_t slice,
    const std::function<void(std::int64_t a, std::int64_t len, ParamState& part)>& step) {
  const std::int64_t block = elementwise_block();
  for (std::int64_t a = 0; a < n; a += slice) {
    const std::int64_t len = std::min(slice, n - a);
    ParamState part;
    part.step = state.step;
    for (const auto& [state_name, t] : state.tensors) {
      part.tensors[state_name] = state_slice(t, state_name, n, a, len, block, name());
      prepare_state_pages(part.tensors[state_name]);
    }
    step(a, len, part);
    for (const auto& [state_name, t] : part.tensors) release_state_pages(t);
  }
}

void Optimizer::update_in_slices(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state,
                                 const NarrowStep& narrow) {
  const std::int64_t block = elementwise_block();
  MT_CHECK(block > 0 && param.is_contiguous(), name(), "param {} (bf16, shape {}) cannot be stepped in slices",
           narrow.index, shape_str(param.shape()));
  const std::int64_t n = param.numel();
  // Slices start on whole blocks of the state and on whole Philox blocks (8 elements) of the rounding.
  const std::int64_t align = std::lcm(block, std::int64_t{8});
  const std::int64_t slice = std::max(align, narrow.rule.slice_elements / align * align);
  const Tensor stored = param.detach().view({n});
  const Tensor g = grad.contiguous().view({n});
  const Tensor comp = narrow.compensation.defined() ? narrow.compensation.view({n}) : Tensor();
  const std::uint64_t stream = rounding_stream(narrow.index, state.step);
  const auto& backend = ::memtrain::detail::backend_for(param.device());
  for_each_state_slice(state, n, slice, [&](std::int64_t a, std::int64_t len, ParamState& part) {
    const Tensor kept = stored.narrow(0, a, len);
    const Tensor kept_comp = comp.defined() ? comp.narrow(0, a, len) : Tensor();
    prepare_state_pages(kept_comp);
    Tensor wide = widened(kept, kept_comp);
    update(wide, g.narrow(0, a, len), group, part);
    backend.round_into_bf16(kept, wide, kept_comp, narrow.rule.seed, stream, static_cast<std::uint64_t>(a));
    release_state_pages(kept_comp);
  });
}

void Optimizer::update_offloaded(Tensor& target, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  const std::int64_t block = elementwise_block();
  const std::int64_t n = target.numel();
  const Tensor flat = target.detach().view({n});
  const Tensor g = grad.contiguous().view({n});
  for_each_state_slice(state, n, std::max(block, narrow_.slice_elements / block * block),
                       [&](std::int64_t a, std::int64_t len, ParamState& part) {
                         Tensor kept = flat.narrow(0, a, len);
                         update(kept, g.narrow(0, a, len), group, part);
                       });
}

void Optimizer::step_in_f32(std::size_t index, Tensor& param, const std::function<void()>& rule) {
  if (param.dtype() != DType::bf16) {
    rule();
    return;
  }
  MT_CHECK(param.is_contiguous(), name(), "param {} is bf16 and non-contiguous (shape {}): a bf16 parameter is "
           "stepped through an f32 copy and must be contiguous", index, shape_str(param.shape()));
  const Tensor grad = param.grad();
  const Tensor compensation = narrow_step(index, param).compensation;
  const Tensor stored = param.detach();  // the bf16 storage the result is rounded into
  Tensor wide;
  {
    CategoryGuard category(MemoryCategory::workspace);
    wide = widened(stored, compensation);
  }
  // The rule steps the parameter itself, pointed at the f32 copy: wrappers (GaLore) and hooks keyed on the
  // tensor find it, and the f32 kernels read it. Its gradient goes with the dtype change and comes back below.
  param.set_data_and_dtype_(wide);
  try {
    rule();
  } catch (...) {
    param.set_data_and_dtype_(stored);
    param.set_grad(grad);
    throw;
  }
  const Tensor updated = param.detach();
  ::memtrain::detail::backend_for(param.device())
      .round_into_bf16(stored, updated, compensation, narrow_.seed, rounding_stream(index, steps_taken(index)), 0);
  release_state_pages(compensation);
  param.set_data_and_dtype_(stored);
  param.set_grad(grad);
}

void Optimizer::ensure_state(const Tensor& target, const ParamGroup& group, ParamState& state) {
  if (state.step != 0) return;
  CategoryGuard category(MemoryCategory::optimizer_state);
  state.tensors.clear();
  try {
    init_state(target, group, state);
  } catch (...) {
    state.tensors.clear();
    throw;
  }
  // Offloaded: what init_state wrote (8-bit zeros are not zero bytes) goes to the files before the step.
  for (const auto& [state_name, t] : state.tensors) release_state_pages(t);
}

void Optimizer::for_each_slot(
    const std::function<void(Tensor& param, const ParamGroup& group, ParamState& state)>& visit) {
  std::vector<const Slot*> order(states_.size());
  for (const auto& [impl, slot] : slots_) order[slot.index] = &slot;
  for (const Slot* slot : order) visit(param_at(*slot), groups_[slot->group], states_[slot->index]);
}

void Optimizer::apply_rule(Tensor& target, const Tensor& grad, const ParamGroup& group, ParamState& state,
                           const NarrowStep* narrow) {
  ensure_state(target, group, state);
  ++state.step;
  CategoryGuard category(MemoryCategory::workspace);
  const bool offloaded = std::any_of(state.tensors.begin(), state.tensors.end(),
                                     [](const auto& entry) { return in_state_arena(entry.second); });
  if (narrow != nullptr && target.dtype() == DType::bf16) {
    update_narrow(target, grad, group, state, *narrow);
  } else if (offloaded && elementwise_block() > 0 && target.dtype() == DType::f32 && target.is_contiguous()) {
    update_offloaded(target, grad, group, state);
  } else {
    update(target, grad, group, state);
  }
  // What a rule that couples its elements touched, all at once (Adafactor's statistics and its bf16 compensation,
  // GaLore's projectors).
  if (offloaded)
    for (const auto& [state_name, t] : state.tensors) release_state_pages(t);
  if (narrow != nullptr) release_state_pages(narrow->compensation);
}

bool Optimizer::step_external(Tensor& target, const Tensor& grad, const ParamGroup& group, ExternalState& state,
                              bool grad_checked, const NarrowStep* narrow) {
  MT_CHECK(target.defined() && grad.defined(), name(), "step_external needs a defined target and gradient");
  MT_CHECK(grad.shape() == target.shape(), name(), "step_external: target has shape {} but its grad has shape {}",
           shape_str(target.shape()), shape_str(grad.shape()));
  autograd::NoGradGuard no_grad;
  if (!grad_checked && !is_finite(grad)) return false;
  MT_CHECK(narrow == nullptr || slices_narrow_params(), name(), "step_external: a bf16 target in slices needs a "
           "rule that steps bf16 parameters in slices, and {} does not", name());
  const std::optional<StateArenaGuard> placed = place_state();
  apply_rule(target, grad, group, state.state_, narrow);
  return true;
}

std::optional<StateArenaGuard> Optimizer::place_state() const {
  if (!state_arena_) return std::nullopt;
  return std::optional<StateArenaGuard>(std::in_place, state_arena_);
}

void Optimizer::set_state_arena(std::shared_ptr<StateArena> arena) {
  MT_CHECK(state_bytes() == 0, name(), "set_state_arena: the optimizer holds {} bytes of state already; choose "
           "where state lives before the first step", state_bytes());
  state_arena_ = std::move(arena);
}

void Optimizer::StatePlan::add(std::size_t tensor_bytes) {
  bytes += tensor_bytes;
  largest_tensor_bytes = std::max(largest_tensor_bytes, tensor_bytes);
}

void Optimizer::StatePlan::add(const StatePlan& other) {
  bytes += other.bytes;
  largest_tensor_bytes = std::max(largest_tensor_bytes, other.largest_tensor_bytes);
}

Optimizer::StatePlan Optimizer::state_plan_of(const Tensor& target, const ParamGroup& group) const {
  autograd::NoGradGuard no_grad;
  CategoryGuard category(MemoryCategory::optimizer_state);
  ParamState state;
  // init_state only allocates (it is not const because a step's call fills the optimizer's own slots). An 8-bit
  // rule makes its codes on the CPU before moving them to the target's device.
  const_cast<Optimizer*>(this)->init_state(target, group, state);
  StatePlan plan;
  for (const auto& [state_name, t] : state.tensors) plan.add(t.nbytes());
  return plan;
}

Optimizer::StatePlan Optimizer::planned_state() const {
  StatePlan plan;
  for (const ParamGroup& group : groups_) {
    // Twins in a twin group: a rule that decides by the whole tensor (whole_shape) finds them there.
    ParamGroup twins = group;
    for (Tensor& p : twins.params) p = Tensor::empty(p.shape(), p.dtype(), Device::meta());
    for (const Tensor& twin : twins.params) {
      plan.add(state_plan_of(twin, twins));
      if (narrow_.kahan && twin.dtype() == DType::bf16) plan.add(twin.nbytes());
    }
  }
  return plan;
}

StepReport Optimizer::step() {
  const std::optional<StateArenaGuard> placed = place_state();
  return step_all();
}

StepReport Optimizer::step_all() {
  StepReport report;
  // Walk slots in state_dict order so that a step is reproducible whatever the hash-map order.
  std::vector<const Slot*> order(states_.size());
  for (const auto& [impl, slot] : slots_) order[slot.index] = &slot;
  for (const Slot* slot : order) {
    switch (step_slot(*slot)) {
      case Outcome::updated: ++report.updated; break;
      case Outcome::nonfinite: ++report.skipped_nonfinite; break;
      case Outcome::no_grad: break;
    }
  }
  return report;
}

bool Optimizer::step_param(const Tensor& param) {
  const std::optional<StateArenaGuard> placed = place_state();
  return step_slot(slot_of(param)) == Outcome::updated;
}

void Optimizer::zero_grad(bool set_to_none) {
  std::vector<Tensor> all;
  all.reserve(states_.size());
  for (const auto& group : groups_) all.insert(all.end(), group.params.begin(), group.params.end());
  autograd::zero_grad(all, set_to_none);
}

Tensor Optimizer::collected(const Tensor& t, StateCopy copy) {
  if (copy == StateCopy::none) return t.detach();
  Tensor out = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  out.copy_(t);
  release_state_pages(t);  // offloaded: the copy is in memory, the state goes back to its files
  return out;
}

StateDict Optimizer::collect_state(StateCopy copy) const {
  StateDict out;
  for (const auto& [impl, slot] : slots_) save_state(states_[slot.index], std::to_string(slot.index), out, copy);
  return out;
}

void Optimizer::save_state(const ParamState& state, const std::string& prefix, StateDict& out, StateCopy copy) const {
  out.emplace(key_of(prefix, "step"), tensor<std::int64_t>({state.step}, {}));
  for (const auto& [name, t] : state.tensors) out.emplace(key_of(prefix, name), collected(t, copy));
}

Optimizer::ParamState Optimizer::load_state(const TensorSource& dict, const std::string& prefix, const Tensor& target,
                                            const ParamGroup& group, std::set<std::string>& used,
                                            std::string_view where) {
  const std::string step_key = key_of(prefix, "step");
  const auto step_info = dict.info(step_key);
  MT_CHECK(step_info.has_value(), where, "missing key '{}'", step_key);
  MT_CHECK(shape_numel(step_info->shape) == 1, where, "key '{}' should hold one step count, got shape {}", step_key,
           shape_str(step_info->shape));
  used.insert(step_key);
  ParamState state;
  state.step = static_cast<std::int64_t>(dict.read(step_key).item());
  MT_CHECK(state.step >= 0, where, "key '{}' holds a negative step {}", step_key, state.step);
  if (state.step == 0) return state;  // never stepped: no state tensors expected
  {
    // The expected names, shapes and dtypes are what init_state allocates for this target.
    CategoryGuard category(MemoryCategory::optimizer_state);
    autograd::NoGradGuard no_grad;
    init_state(target, group, state);
  }
  for (auto& [name, t] : state.tensors) {
    const std::string key = key_of(prefix, name);
    const auto found = dict.info(key);
    MT_CHECK(found.has_value(), where, "missing key '{}' (expected shape {} {})", key, shape_str(t.shape()),
             dtype_name(t.dtype()));
    MT_CHECK(found->shape == t.shape() && found->dtype == t.dtype(), where,
             "key '{}' has shape {} {} but this optimizer expects {} {} (param shape {})", key,
             shape_str(found->shape), dtype_name(found->dtype), shape_str(t.shape()), dtype_name(t.dtype()),
             shape_str(target.shape()));
    dict.read_into(key, t);
    release_state_pages(t);
    used.insert(key);
  }
  return state;
}

StateDict Optimizer::with_compensations(StateDict state, StateCopy copy) const {
  for (std::size_t i = 0; i < compensations_.size(); ++i)
    if (compensations_[i].defined())
      state.emplace(key_of(std::to_string(i), kCompensation), collected(compensations_[i], copy));
  return state;
}

namespace {

// The parameter index of a Kahan compensation's key ("12.kahan"), or nullopt for any other key.
std::optional<std::string> compensation_index(const std::string& key) {
  const std::size_t dot = key.find('.');
  if (dot == std::string::npos || key.compare(dot + 1, std::string::npos, kCompensation) != 0) return std::nullopt;
  return key.substr(0, dot);
}

}  // namespace

void Optimizer::load_state_dict(const TensorSource& dict) {
  const std::string where = fmt::format("{}::load_state_dict", name());
  const std::optional<StateArenaGuard> placed = place_state();
  std::vector<Tensor> fresh(compensations_.size());
  for (const std::string& key : dict.names()) {
    const auto number = compensation_index(key);
    if (!number) continue;
    MT_CHECK(!number->empty() && number->find_first_not_of("0123456789") == std::string::npos, where,
             "unexpected key '{}'", key);
    const std::size_t index = std::stoul(*number);
    MT_CHECK(index < compensations_.size(), where, "unexpected key '{}': this optimizer has {} parameters", key,
             compensations_.size());
    MT_CHECK(narrow_.kahan, where, "key '{}' holds a Kahan compensation, but this optimizer rounds bf16 parameters "
             "stochastically (NarrowParams.kahan false; param_dtype bf16-kahan saved it)", key);
    const Tensor* param = &param_at_index(index);
    const TensorInfo t = *dict.info(key);
    MT_CHECK(param->dtype() == DType::bf16 && t.dtype == DType::bf16 && t.shape == param->shape(), where,
             "key '{}' has shape {} {} but param {} is {} {} (a compensation is bf16 of a bf16 parameter's shape)",
             key, shape_str(t.shape), dtype_name(t.dtype), index, shape_str(param->shape()),
             dtype_name(param->dtype()));
    CategoryGuard category(MemoryCategory::optimizer_state);
    fresh[index] = Tensor::empty(t.shape, DType::bf16, param->device());
    dict.read_into(key, fresh[index]);
    release_state_pages(fresh[index]);
  }
  load_rule_state(dict);
  compensations_ = std::move(fresh);
}

void Optimizer::check_all_used(const TensorSource& dict, const std::set<std::string>& used,
                               std::string_view where) const {
  for (const std::string& key : dict.names()) {
    if (used.count(key) != 0 || compensation_index(key)) continue;
    const auto t = dict.info(key);
    MT_CHECK(false, where, "unexpected key '{}' (shape {}); this optimizer has {} parameters", key,
             t ? shape_str(t->shape) : std::string("undefined"), states_.size());
  }
}

void Optimizer::load_rule_state(const TensorSource& dict) {
  const std::string where = fmt::format("{}::load_state_dict", name());
  std::vector<ParamState> fresh(states_.size());
  std::set<std::string> used;
  for (const auto& [impl, slot] : slots_) {
    fresh[slot.index] = load_state(dict, std::to_string(slot.index), groups_[slot.group].params[slot.index_in_group],
                                   groups_[slot.group], used, where);
  }
  check_all_used(dict, used, where);
  states_ = std::move(fresh);
}

void Optimizer::save_external(const ExternalState& state, const std::string& prefix, StateDict& out,
                              StateCopy copy) const {
  save_state(state.state_, prefix, out, copy);
}

Optimizer::ExternalState Optimizer::load_external(const TensorSource& dict, const std::string& prefix,
                                                  const Tensor& target, const ParamGroup& group,
                                                  std::set<std::string>& used, std::string_view where) {
  ExternalState out;
  out.state_ = load_state(dict, prefix, target, group, used, where);
  return out;
}

std::size_t Optimizer::ExternalState::bytes() const {
  std::size_t total = 0;
  for (const auto& [name, t] : state_.tensors) total += t.nbytes();
  return total;
}

void Optimizer::reset_state(const Tensor& param) {
  const std::size_t index = slot_of(param).index;
  states_[index] = ParamState{};
  compensations_[index] = Tensor();
}

std::size_t Optimizer::compensation_bytes() const {
  std::size_t total = 0;
  for (const Tensor& t : compensations_)
    if (t.defined()) total += t.nbytes();
  return total;
}

std::size_t Optimizer::rule_state_bytes() const {
  std::size_t total = 0;
  for (const auto& state : states_)
    for (const auto& [name, t] : state.tensors) total += t.nbytes();
  return total;
}

void Optimizer::check_f32_contiguous(const Tensor& param, std::string_view who) {
  MT_CHECK((param.dtype() == DType::f32 || param.dtype() == DType::bf16) && param.is_contiguous(), who,
           "needs contiguous f32 (or bf16, stepped through f32) parameters, got shape {} dtype {} on {}{}", shape_str(param.shape()),
           dtype_name(param.dtype()), param.device().str(), param.is_contiguous() ? "" : " (non-contiguous)");
  // The step is the device's backend's (meta: the CPU's code without data, so a step there accounts the CPU
  // step's bytes); backend_for throws naming the device when no backend serves it.
  ::memtrain::detail::backend_for(param.device());
}

Tensor Optimizer::grad_f32(const Tensor& grad, Device device) {
  if (grad.dtype() == DType::f32 && grad.is_contiguous() && grad.device() == device) return grad;
  // Conversions run on the CPU; a device gradient of another dtype or layout makes a round trip.
  Tensor converted = grad.to(Device::cpu()).to(DType::f32).contiguous();
  return converted.to(device);  // no copy when device is the CPU
}

}  // namespace memtrain::optim
