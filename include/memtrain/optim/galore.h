// GaLore (Zhao et al. 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank Projection") as a
// wrapper around any base optimizer described by a Spec. For a projected parameter W (m x n, CPU f32) with
// gradient G, at its t-th update (t = 0, 1, ...):
//   R = projector.project(G, t)   basis refreshed from G's SVD at t = 0, update_gap, 2*update_gap, ...
//   D = the base rule run on a zero workspace tensor of R's shape with gradient R and weight_decay 0, which
//       leaves D = the update the base would add (-lr * N for AdamW); the base state has R's shape and, as in
//       galore_torch, is neither reset nor rotated when the basis changes
//   W = W * (1 - lr * wd) + project_back(D)            (project_back multiplies by scale)
// Weight decay on projected parameters is decoupled and applied to the old W before the update, the order of
// our AdamW / Lion / Adafactor; GaLoreSpec::decay_order = after applies it to the updated W instead, as
// galore_torch does (the two differ by lr^2 * wd terms). With that and an AdamW base in the hf epsilon form
// (adamw.h), a projected weight follows galore_torch's GaLore-AdamW to float rounding (tests/test_galore_torch.cpp).
// It is decoupled for an SGD base too, whose own weight_decay is L2 on the gradient: added to G it would mostly
// be projected away.
// Parameters in the plain groups are stepped by the base rule itself, exactly as the base optimizer would.
// Every base works on the zero workspace: SGD (momentum buffer), AdamW, Lion, AdamW8bit / Lion8bit (8-bit
// state of R's shape when R has >= min_8bit_size elements), Adafactor (our Adafactor has no relative-step
// or parameter-scale options, so it never reads the parameter; its update clipping uses R's update).
// Hyper-parameters are read from param_groups() at every step, so schedules that change lr apply to both.
//
// Accumulation in the projected space (layer-wise updates, train/trainer.h): projection is linear, so the
// projected gradients of a step's micro-batches can be summed there and the full gradient freed at once:
//   accumulate(W, G_1) ... accumulate(W, G_{k-1});  R = projected_gradient(W, G_k);  step_projected_gradient(W, R)
// steps W from sum_i P^T G_i = P^T sum_i G_i, which is ordinary GaLore with grad_accum = k up to fp32 rounding,
// except at a refresh step: the basis is refreshed from the FIRST micro-batch's gradient G_1 (the summed
// gradient never exists), and the step's later micro-batches project on that basis without refreshing again.
//
// State: the base state of every parameter (R's shape for projected ones) plus each projector's basis
// (GaLoreProjector::bytes()); state_bytes() is exactly their sum. Projection runs in f32 on the parameter's
// device: on CUDA the projector uses cuBLAS / cuSOLVER (galore_projector.h), and the base state, the basis and
// the accumulators live on the device, where the base rule runs its device kernels (AdamW, AdamW8bit, Lion,
// Lion8bit, SGD, Adafactor). Bases take canonical signs (galore_projector.h), so a device run follows the CPU's.
#pragma once

#include "memtrain/optim/galore_projector.h"
#include "memtrain/optim/optimizer.h"
#include "memtrain/optim/spec.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace memtrain::optim {

// GaLore's options are its projectors' (galore_projector.h), with `seed` the base of their streams:
// parameter i's projector draws from the Philox stream seed + i.
using GaLoreSpec = GaLoreProjectorOptions;

// Parameters split by how they are stepped; param_groups() holds the projected groups, then the plain ones,
// and state_dict numbers parameters in that order.
struct GaLoreGroups {
  std::vector<ParamGroup> projected;  // 2-D f32 weights (CPU or CUDA), stepped in the projected space
  std::vector<ParamGroup> plain;      // stepped by the base rule as usual
};

// The default choice of the GaLore paper and galore_torch (target modules "attn" and "mlp"): 2-D ".weight"
// parameters below a module named "attn", "self_attn" or "mlp" (GPT-2 "h.3.attn.c_attn.weight", LLaMA
// "layers.0.mlp.gate_proj.weight"). Embeddings, norms, biases and the LM head are not targets.
bool is_galore_target(std::string_view name, const Tensor& param);
// Targets chosen by name patterns (TrainerConfig::galore_targets): a pattern is a glob over the whole
// parameter name in which '*' matches any run of characters, dots included ("*.w_in.weight",
// "mixer.*.weight", "blocks.0.ff.weight"); every other character matches itself. A parameter is a target when
// it is 2-D and some pattern matches it: a matching parameter of another rank (a norm gain under "*.weight")
// is skipped, since GaLore projects matrices only. Empty `targets` is the default rule above.
bool is_galore_target(std::string_view name, const Tensor& param, const std::vector<std::string>& targets);
// Targets in one projected group with `weight_decay`; the rest split by decay_groups (spec.h).
GaLoreGroups galore_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                           double weight_decay);
// The same with targets chosen by `targets` (empty: the default rule, as above). Non-empty patterns that
// select nothing throw, listing the 2-D parameters there are to choose from (describe_matrices).
GaLoreGroups galore_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                           double weight_decay, const std::vector<std::string>& targets);
// "mixer.w_in.weight [64, 16], ..." : the 2-D parameters of `named` (GaLore's candidates), the first
// `max_listed` of them and then how many more; "none" when there are none.
std::string describe_matrices(const std::vector<std::pair<std::string, Tensor>>& named,
                              std::size_t max_listed = 16);

class GaLore final : public Optimizer {
 public:
  // The spec's family options (betas, eps, momentum, ...) are written into every group, as Spec::make does.
  GaLore(const Spec& base, const GaLoreSpec& galore, GaLoreGroups groups);

  std::string_view name() const override { return name_; }  // "galore-adamw", "galore-lion8bit", ...

  // Keys per parameter i: the base's own ("i.step", "i.exp_avg", ...) and, for a projected parameter once
  // stepped, "i.galore.left" (m, r) and/or "i.galore.right" (n, r), "i.galore.rng" (i64 [2]: Philox seed
  // and offset) and "i.galore.refresh_count" (i64): a restored optimizer continues bit-identically.
  StateDict collect_state(StateCopy copy) const override;
  void load_rule_state(const TensorSource& state) override;

  // Keys each projected weight's random stream by stream_index[i] (one entry per parameter, in the groups'
  // order) instead of by its own index i: a pipeline stage holds part of the model and keys its weights as the
  // whole model does, so their random projections are the whole model's. Before the first step only.
  void key_streams(const std::vector<std::size_t>& stream_index);

  // Refused: a projected weight's state lives with its projector, which is not rebuilt mid-run.
  void reset_state(const Tensor& param) override;

  std::size_t rule_state_bytes() const override;  // the three below
  // The base state of every parameter (R's shape when projected, whole: an upper bound under StateShards) and
  // every projector's basis.
  StatePlan planned_state() const override;
  std::size_t projected_state_bytes() const;  // base state of the projected parameters (R's shapes)
  std::size_t projector_bytes() const;        // the projectors' bases
  std::size_t plain_state_bytes() const;      // base state of the plain parameters

  // ZeRO-1 (train::Trainer with config.zero 1): every rank holds the whole summed gradient G of a projected W,
  // so every rank computes the same R and refreshes the same basis (the projector is replicated: no exchange,
  // the decomposition runs on identical inputs). The base state covers only this rank's `range` of R's
  // elements (boundaries on 256-element blocks, so a range's 8-bit blocks are the whole R's; 8-bit or not by
  // R's whole size). A rank steps its range of the update D, `gather` fills in the other ranks' ranges (all
  // ranks call it together, projected parameter by projected parameter in order: an all-gather of R's size,
  // r*n or m*r floats, never W's), and every rank adds the same P D (or D Q^T) to its whole W, so W itself
  // needs no exchange. Call before the first step and before load_state_dict. Checkpoint keys then hold each
  // base state tensor flat, over the range alone; "i.step" is written even by a rank whose range is empty.
  struct StateShards {
    std::function<std::pair<std::int64_t, std::int64_t>(std::int64_t numel)> range;  // this rank's [begin, end)
    std::function<void(Tensor& flat)> gather;  // fills the other ranks' ranges of a whole contiguous tensor
  };
  void shard_projected_state(StateShards shards);
  bool projected_state_sharded() const { return static_cast<bool>(shards_.gather); }

  bool is_projected(const Tensor& param) const;
  // R's shape for projected `param` (m, n): (r, n), (m, r) or (r, r) by the projection side.
  Shape projected_shape(const Tensor& param) const;
  // The projector of a projected parameter (nullptr for a plain one); throws for a tensor not in a group.
  const GaLoreProjector* projector(const Tensor& param) const;
  const GaLoreSpec& galore_spec() const { return galore_; }

  // Adds project(grad) into the accumulator of projected `param` for the step in progress, refreshing the
  // basis first when this is a refresh step and nothing was accumulated yet. The accumulator (R's shape, f32)
  // is allocated under MemoryCategory::gradients: it is gradient memory. A non-finite grad marks the step
  // to be skipped (nothing is projected, so a refresh never sees it).
  void accumulate(const Tensor& param, const Tensor& grad);
  // Whether `param` has an accumulator for the step in progress.
  bool has_accumulated(const Tensor& param) const;
  // The projected gradient of the step in progress: the accumulator plus project(grad) (grad may be
  // undefined when accumulate() ran before); clears the accumulator. With nothing accumulated this is the
  // R that step() would use. Undefined when the step must be skipped (a non-finite gradient was seen).
  Tensor projected_gradient(const Tensor& param, const Tensor& grad);
  // One update of projected `param` from R (projected_gradient's, possibly scaled, e.g. clipped), as step()
  // makes it. False, with nothing changed, when R holds NaN or Inf.
  bool step_projected_gradient(const Tensor& param, const Tensor& R);
  std::size_t accumulator_bytes() const;  // accumulators alive now (rank x n floats per left-projected W)

 protected:
  void init_state(const Tensor& param, const ParamGroup& group, ParamState& state) override;
  void update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) override;
  std::int64_t steps_taken(std::size_t index) const override;  // e.steps, or the base rule's count (plain)
  // A plain (unprojected) parameter steps in slices when the base rule is elementwise.
  bool steps_in_slices(std::size_t index) const override;

 private:
  struct Entry {
    std::unique_ptr<GaLoreProjector> projector;  // null for a plain parameter
    ExternalState base;                          // the base rule's state (R's shape when projected)
    Tensor accumulated;                          // sum of this step's projected micro-batch gradients
    std::int64_t steps = 0;                      // updates made (the base's step count, kept with a sharded one)
    bool skip = false;                           // a non-finite micro-batch gradient was seen this step
  };
  // (number of projected groups, all groups with the spec's family options)
  static std::pair<std::size_t, std::vector<ParamGroup>> merge_groups(const Spec& spec, GaLoreGroups groups);
  GaLore(const Spec& base, const GaLoreSpec& galore, std::pair<std::size_t, std::vector<ParamGroup>> merged);
  std::size_t index_of(const Tensor& param) const;
  GaLoreProjectorOptions projector_options(std::size_t index) const;
  // One update of a projected parameter from its projected gradient R (the projector has just seen G).
  void step_projected(Tensor& param, const Tensor& R, const ParamGroup& group, Entry& entry);
  // Offloaded state (Optimizer::set_state_arena): the basis goes back to its files until a step reads it again.
  static void release_basis(const Entry& entry);
  Entry& projected_entry(const Tensor& param, const char* who);
  const ParamGroup& group_of(std::size_t index) const;

  // Saves / loads the base state of projected entry `i` when it is sharded (see StateShards).
  void save_sharded(std::size_t i, const Tensor& param, StateDict& out, StateCopy copy) const;
  // Fills entry.base and entry.steps.
  void load_sharded(const TensorSource& dict, std::size_t i, const Tensor& param, const ParamGroup& group,
                    std::set<std::string>& used, const std::string& where, Entry& entry);
  const Tensor& param_of(std::size_t index) const;  // by state_dict numbering
  // hyper_of(group, 0) over `part`, a range of the whole R of `r_numel` elements.
  static ParamGroup range_group(const ParamGroup& group, const Tensor& part, std::int64_t r_numel);

  GaLoreSpec galore_;
  StateShards shards_;  // empty unless sharded
  std::string name_;
  std::unique_ptr<Optimizer> rule_;  // the base optimizer, holding no parameters: its rule and checks
  std::vector<Entry> entries_;       // by parameter index (state_dict numbering)
  std::unordered_map<const TensorImpl*, std::size_t> index_;
};

}  // namespace memtrain::optim
