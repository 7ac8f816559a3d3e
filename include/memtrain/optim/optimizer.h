// Optimizer: updates parameters from their gradients, over parameter groups with their own
// hyper-parameters. State tensors are allocated under MemoryCategory::optimizer_state, lazily at a
// parameter's first step, and state_bytes() counts them exactly. step() updates every parameter that has
// a gradient; step_param() updates one, so it can run inside a gradient-ready hook (layer-wise updates).
// A parameter whose gradient holds NaN or Inf is skipped with its state untouched (and counted).
// A parameter stored in bf16 (no f32 master) is stepped through an f32 copy and rounded back (NarrowParams).
//
// Subclasses implement init_state (runs once, under CategoryGuard(optimizer_state): allocate every state
// tensor there) and update (runs under NoGrad and CategoryGuard(workspace), so temporaries are not
// counted as state). The concrete optimizers live in sgd.h, adamw.h, lion.h, adafactor.h; spec.h builds
// one from a value.
//
// Wrappers (GaLore, galore.h) run an optimizer's rule on tensors they own, with state they own, through
// step_external / save_external / load_external; they override the state accessors to count and save
// that state (and their own) in place of the per-parameter state kept here.
#pragma once

#include "memtrain/core/state_arena.h"
#include "memtrain/core/tensor.h"
#include "memtrain/core/tensor_source.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace memtrain::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0.0;  // decoupled (AdamW-style) where the optimizer supports it
  double beta1 = 0.9;         // AdamW/Lion: first-moment coefficient; SGD: momentum
  double beta2 = 0.999;       // AdamW/Lion: second coefficient
  double eps = 1e-8;
  // ZeRO shards (dist::DataParallel): for each of params, the shape of the whole tensor it is a flat shard of.
  // What an optimizer decides per tensor (8-bit state or 32-bit) it decides on the whole tensor, so every
  // shard of one tensor, at any world size, keeps the same kind of state. Empty: each param is whole.
  std::vector<Shape> whole_shape;
};

// The shape of the whole tensor `param` (a member of group.params) is a shard of: group.whole_shape's entry
// for it, or its own shape when the group has none.
Shape whole_shape(const Tensor& param, const ParamGroup& group);
std::int64_t whole_numel(const Tensor& param, const ParamGroup& group);

// Name -> tensor; keys are "<param index>.<state name>" with params numbered across groups in order,
// plus "<param index>.step" (an i64 scalar). Tensors are CPU copies independent of the optimizer.
using StateDict = std::map<std::string, Tensor>;

// How a parameter stored in bf16 without an f32 master (train::TrainerConfig::param_dtype) is stepped: the
// parameter itself is pointed at an f32 copy of its value (plus its compensation under Kahan) for the rule,
// so every optimizer, wrapper and hook that keys on the tensor finds it; the result is rounded back into the
// bf16 storage by the backend's round_into_bf16 and the parameter pointed at it again. Rounding is
//   stochastic (kahan false): unbiased, its bits from Philox keyed by (seed, the parameter's index in
//     state_dict order, the parameter's step count, the element), so bit-identical at any thread count, on
//     any backend, and after a resume (the step count is in the state dict);
//   Kahan (kahan true): to nearest, the remainder kept in a bf16 compensation tensor per parameter
//     (2 bytes per element, optimizer state: "<index>.kahan" in the state dict, counted in state_bytes()),
//     added back before the next step.
// An elementwise rule (AdamW, SGD, Lion, the 8-bit ones: elementwise_block() > 0) steps a bf16 parameter a slice
// of slice_elements at a time (rounded down to its state's block), so its f32 copies of the value and of the
// gradient take 2 x 4 bytes x slice_elements at most (32 MiB by default) whatever the parameter's size, with the
// same bits as one slice would give. Adafactor does too (its statistics first, from the whole gradient read a
// block at a time: the backend's adafactor_step_bf16); GaLore's projected weights step whole tensors.
struct NarrowParams {
  std::uint64_t seed = 0;
  bool kahan = false;
  std::int64_t slice_elements = std::int64_t{1} << 22;
};

// What a step saw: parameters whose gradient held NaN or Inf were skipped, their state left untouched.
struct StepReport {
  std::int64_t updated = 0;
  std::int64_t skipped_nonfinite = 0;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string_view name() const = 0;

  // Steps every parameter with a gradient (step_all).
  StepReport step();
  // Updates one parameter (must belong to a group) from its current grad(); false when skipped
  // (no gradient, or a non-finite one).
  bool step_param(const Tensor& param);
  void zero_grad(bool set_to_none = true);

  // The state as CPU copies: a snapshot that later steps do not change.
  StateDict state_dict() const { return with_compensations(collect_state(StateCopy::to_cpu), StateCopy::to_cpu); }
  // The same entries without copying the state tensors: they are the optimizer's own, on their device, valid
  // until its next step. For a caller that reads them at once (Trainer::save_checkpoint writes them out), so a
  // checkpoint does not hold a second copy of the optimizer state.
  StateDict state_view() const { return with_compensations(collect_state(StateCopy::none), StateCopy::none); }
  // Restores state saved by the same optimizer type over the same parameter shapes; throws naming the key
  // on a missing, unexpected or mis-shaped entry (Kahan compensations included: saved with kahan on, they
  // load only with it on). Each state tensor is read from the source straight into the one it restores (a
  // checkpoint file is not read into memory first); the state held before is replaced, and freed, only once
  // every entry has loaded, so a throw leaves it as it was.
  void load_state_dict(const TensorSource& state);
  void load_state_dict(const StateDict& state) { load_state_dict(MapTensorSource(state)); }

  // bytes of every state tensor, exactly: the rule's (rule_state_bytes) and the Kahan compensations
  std::size_t state_bytes() const { return rule_state_bytes() + compensation_bytes(); }
  virtual std::size_t rule_state_bytes() const;
  std::size_t compensation_bytes() const;

  // How bf16 parameters are rounded (NarrowParams); stochastic with seed 0 unless set. Set it before the first
  // step: switching Kahan on or off once a bf16 parameter has stepped throws.
  void set_narrow_params(NarrowParams rule);
  const NarrowParams& narrow_params() const { return narrow_; }
  // Frees the state of `param` (a member of a group): its tensors go and its step count returns to 0, so
  // its next step starts from fresh state, as its first did (LISA re-freezes blocks this way). Virtual: an
  // optimizer that keeps state of its own per parameter (GaLore) must free that too, or refuse.
  virtual void reset_state(const Tensor& param);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  // Optimizer offload (core/state_arena.h): from now on the state this optimizer makes (a step's, a load's, a
  // wrapper's own) takes its bytes from `arena` on the devices it serves; null: from the device's allocator as
  // before. Before any state exists. An elementwise rule then steps a parameter a slice of
  // NarrowParams::slice_elements at a time and hands each slice's state back to the arena (release) once
  // stepped, as does a checkpoint save once it has written a state tensor: with FileArena the process holds the
  // state of one slice at a time, with the same bits as in memory.
  void set_state_arena(std::shared_ptr<StateArena> arena);
  const std::shared_ptr<StateArena>& state_arena() const { return state_arena_; }
  // The state a step of every parameter makes (state_bytes() after it; before the first step, what it will be):
  // for the start-up check of an offload directory, where each state tensor is a file of its own.
  struct StatePlan {
    std::size_t bytes = 0;                 // every state tensor together
    std::size_t largest_tensor_bytes = 0;  // the largest one
    void add(std::size_t tensor_bytes);
    void add(const StatePlan& other);
  };
  // Default: init_state on a meta twin of each parameter, plus the Kahan compensations of bf16 parameters;
  // GaLore adds its projectors.
  virtual StatePlan planned_state() const;
  // What init_state makes for `target` in `group` (which holds it): on a meta target nothing stays allocated.
  StatePlan state_plan_of(const Tensor& target, const ParamGroup& group) const;

 protected:
  // The arena guard of this optimizer's entry points (step, step_param, step_external, load_state_dict; a wrapper's
  // own, as GaLore's layer-wise calls); empty without an arena, so a wrapper's rule keeps its wrapper's.
  std::optional<StateArenaGuard> place_state() const;
  // step()'s work (virtual: an optimizer whose step couples its parameters, as Adafactor over ZeRO row shards
  // does, runs its own).
  virtual StepReport step_all();
  // Per-parameter state: named tensors (allocated by the optimizer under optimizer_state) and a step count.
  struct ParamState {
    std::int64_t step = 0;
    std::map<std::string, Tensor> tensors;
  };
  // Allocates the state of a parameter at its first step.
  virtual void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) = 0;
  // Applies one update; state.step has already been incremented. Runs under NoGrad. `grad` has the
  // parameter's shape; it is finite but may be of any dtype/layout (see grad_f32).
  virtual void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) = 0;

  // Helpers for fp32 kernels: throws "<who>: ..." unless `param` is a contiguous f32 tensor on a device
  // with a backend (CPU, meta, CUDA in a CUDA build with a device). A bf16 parameter passes too: update()
  // sees it as f32 (NarrowParams), and init_state reads only its shape and device.
  static void check_f32_contiguous(const Tensor& param, std::string_view who);
  // `grad` itself when it is contiguous f32 on `device`, else a converted copy there (under the current
  // category).
  static Tensor grad_f32(const Tensor& grad, Device device = Device::cpu());
  // True when every element is finite (any dtype, CPU or CUDA): the gate in front of every update.
  static bool is_finite(const Tensor& g);
  // Runs `rule`, a step of parameter `index` (state_dict numbering) that updates `param` in place. An f32
  // param is stepped as it is; a bf16 one is pointed at an f32 copy of its value (plus its Kahan compensation)
  // for the rule and rounded back into its storage after it (NarrowParams), its gradient kept. For a wrapper
  // that steps a parameter outside step() / step_param() (GaLore's layer-wise path).
  void step_in_f32(std::size_t index, Tensor& param, const std::function<void()>& rule);
  // Whether parameter `index`, stored in bf16, is stepped in slices; GaLore answers per parameter.
  virtual bool steps_in_slices(std::size_t /*index*/) const { return slices_narrow_params(); }
  // The rounding stream of parameter `index` at its step count `step` (the Philox counter's high word).
  static std::uint64_t rounding_stream(std::size_t index, std::int64_t step);

 public:
  // The block an elementwise rule keeps its state per: update() may then run on a slice [a, b) of a flattened
  // parameter (a a multiple of the block) with the gradient's slice and each state tensor's: its [a, b) when it
  // has the parameter's numel, its blocks [a / block, ceil(b / block)) when it has one element per block. 0 (the
  // default): the rule couples elements (Adafactor's factored statistics, GaLore) and steps whole tensors.
  virtual std::int64_t elementwise_block() const { return 0; }
  // Whether this rule steps a bf16 parameter itself, a slice at a time (update_narrow): the elementwise rules, and
  // Adafactor. Otherwise it is stepped through an f32 copy of the whole parameter (step_in_f32).
  virtual bool slices_narrow_params() const { return elementwise_block() > 0; }

  // What stepping a bf16 parameter in slices needs from the optimizer that owns it: the parameter's index (the
  // rounding's stream), the rounding, and its Kahan compensation (undefined without Kahan).
  struct NarrowStep {
    std::size_t index = 0;
    NarrowParams rule;
    Tensor compensation;
  };

 protected:
  // The NarrowStep of bf16 parameter `index`; allocates its compensation (optimizer_state) at its first step.
  NarrowStep narrow_step(std::size_t index, const Tensor& param);
  // Steps bf16 `param` (its state ensured and counted) with `narrow`'s rounding, a slice at a time: by default
  // update() on each slice (update_in_slices); a rule that couples elements overrides it (Adafactor).
  virtual void update_narrow(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state,
                             const NarrowStep& narrow);
  // How many steps parameter `index` has taken, as its saved state records it (the rounding of a bf16
  // parameter is keyed by it, so a resumed run rounds as the uninterrupted one). Virtual: a wrapper that keeps
  // its own count (GaLore) answers from it.
  virtual std::int64_t steps_taken(std::size_t index) const { return states_[index].step; }
  // For a step of its own: every parameter in state_dict order, with its group and state.
  void for_each_slot(const std::function<void(Tensor& param, const ParamGroup& group, ParamState& state)>& visit);
  // init_state under MemoryCategory::optimizer_state when the state is fresh (step 0), as a step does first.
  void ensure_state(const Tensor& target, const ParamGroup& group, ParamState& state);

 public:
  // The state of one tensor stepped by this optimizer's rule outside its groups (see step_external).
  class ExternalState {
   public:
    std::int64_t step() const { return state_.step; }
    std::size_t bytes() const;  // bytes of its state tensors, exactly

   private:
    friend class Optimizer;
    ParamState state_;
  };

  // Runs this optimizer's rule on `target` (any tensor the caller owns, not in a group) with gradient
  // `grad` (target's shape) and `group`'s hyper-parameters (its params are ignored): init_state at the first
  // step, the step count, NoGrad and the memory categories exactly as step_param. False, with nothing
  // changed, when grad holds NaN or Inf; `grad_checked` skips that scan for a caller that already made it.
  // `narrow`: target is a bf16 parameter of the caller's, stepped in slices (NarrowStep, above).
  bool step_external(Tensor& target, const Tensor& grad, const ParamGroup& group, ExternalState& state,
                     bool grad_checked = false, const NarrowStep* narrow = nullptr);
  // Whether collected state tensors are CPU copies (state_dict) or the tensors themselves (state_view).
  enum class StateCopy { to_cpu, none };
  // state_dict's and state_view's entries (the Kahan compensations are added after them); an optimizer with
  // state of its own (GaLore) extends it.
  virtual StateDict collect_state(StateCopy copy) const;
  // load_state_dict of everything but the Kahan compensations; an optimizer with state of its own extends it.
  virtual void load_rule_state(const TensorSource& state);
  // Throws naming the first entry of `state` that is not in `used` and not a Kahan compensation (which
  // load_state_dict reads itself).
  void check_all_used(const TensorSource& state, const std::set<std::string>& used, std::string_view where) const;
  // The tensor as collected: a CPU copy, or t itself.
  static Tensor collected(const Tensor& t, StateCopy copy);
  // Writes `state` as "<prefix>.step" and "<prefix>.<state name>", as collect_state does.
  void save_external(const ExternalState& state, const std::string& prefix, StateDict& out, StateCopy copy) const;
  // Reads back what save_external wrote under `prefix` for a target shaped like `target`, checking names,
  // shapes and dtypes against init_state; adds the keys it read to `used`. Throws "<where>: ..." naming
  // the key.
  ExternalState load_external(const TensorSource& dict, const std::string& prefix, const Tensor& target,
                              const ParamGroup& group, std::set<std::string>& used, std::string_view where);

 private:
  struct Slot {
    std::size_t group;
    std::size_t index;  // position across all groups (state_dict numbering)
    std::size_t index_in_group = 0;
  };
  const Slot& slot_of(const Tensor& param) const;
  Tensor& param_at(const Slot& slot) { return groups_[slot.group].params[slot.index_in_group]; }
  const Tensor& param_at(const Slot& slot) const { return groups_[slot.group].params[slot.index_in_group]; }
  const Tensor& param_at_index(std::size_t index) const;  // by state_dict numbering
  enum class Outcome { updated, no_grad, nonfinite };
  Outcome step_slot(const Slot& slot);
  StateDict with_compensations(StateDict state, StateCopy copy) const;
  // init_state at the first step, then the update; the gradient is known to be finite.
  // With `narrow`, target is bf16 and the update runs slice by slice (update_in_slices).
  void apply_rule(Tensor& target, const Tensor& grad, const ParamGroup& group, ParamState& state,
                  const NarrowStep* narrow = nullptr);
  void update_in_slices(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state,
                        const NarrowStep& narrow);
  // An f32 target of an elementwise rule whose state is in an arena: update() a slice at a time, each slice's
  // state released to the arena after it.
  void update_offloaded(Tensor& target, const Tensor& grad, const ParamGroup& group, ParamState& state);
  // Calls step(a, len, part) for the slices [a, a + len) of an n-element parameter, `slice` elements each (a
  // multiple of the rule's block), with `part` the slice's share of each of state's tensors: mapped before (an
  // arena's prepare) and handed back after (release), so offloaded state is resident a slice at a time.
  void for_each_state_slice(const ParamState& state, std::int64_t n, std::int64_t slice,
                            const std::function<void(std::int64_t a, std::int64_t len, ParamState& part)>& step);
  void save_state(const ParamState& state, const std::string& prefix, StateDict& out, StateCopy copy) const;
  ParamState load_state(const TensorSource& dict, const std::string& prefix, const Tensor& target,
                        const ParamGroup& group, std::set<std::string>& used, std::string_view where);

  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, Slot> slots_;
  std::vector<ParamState> states_;  // by slot index
  NarrowParams narrow_;
  std::vector<Tensor> compensations_;  // by slot index: Kahan's bf16 remainders, once a bf16 parameter steps
  std::shared_ptr<StateArena> state_arena_;
};

}  // namespace memtrain::optim
