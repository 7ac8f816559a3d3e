// Adafactor: the state and the step count; the step is the backend's adafactor_step (CPU:
// src/cpu/optim_adafactor.cpp, statistics in double; CUDA: kernels/adafactor.cu, deterministic device
// reductions; meta: the bytes only).
#include "memtrain/optim/adafactor.h"

#include "core/backend.h"

namespace memtrain::optim {

Adafactor::Adafactor(std::vector<ParamGroup> groups, AdafactorOptions options)
    : Optimizer(std::move(groups)), options_(options) {
  MT_CHECK(options_.decay_rate < 0.0, "Adafactor", "decay_rate must be negative, got {}", options_.decay_rate);
  MT_CHECK(options_.clip_threshold > 0.0, "Adafactor", "clip_threshold must be positive, got {}",
           options_.clip_threshold);
  MT_CHECK(options_.eps1 >= 0.0, "Adafactor", "eps1 must be >= 0, got {}", options_.eps1);
  if (options_.use_first_moment) {
    for (std::size_t g = 0; g < param_groups().size(); ++g) {
      const double b1 = param_groups()[g].beta1;
      MT_CHECK(b1 >= 0.0 && b1 < 1.0, "Adafactor", "group {}: beta1 must lie in [0, 1), got {}", g, b1);
    }
  }
}

void Adafactor::init_state(const Tensor& param, const ParamGroup& group, ParamState& state) {
  if (param.dtype() != DType::bf16) check_f32_contiguous(param, "Adafactor");  // bf16: a parameter with no master
  // A row shard's factored statistics are the whole tensor's (replicated); the rest covers the shard.
  const Shape s = whole_shape(param, group);
  const Device device = param.device();
  if (s.size() >= 2) {
    Shape row(s.begin(), s.end() - 1);  // [..., m]
    Shape col(s.begin(), s.end() - 2);  // [..., n]
    col.push_back(s.back());
    state.tensors["exp_avg_sq_row"] = zeros(row, DType::f32, device);
    state.tensors["exp_avg_sq_col"] = zeros(col, DType::f32, device);
  } else if (param.numel() > 0) {  // a rank's empty row shard keeps no elementwise state
    state.tensors["exp_avg_sq"] = zeros(param.shape(), DType::f32, device);
  }
  if (options_.use_first_moment && param.numel() > 0) state.tensors["exp_avg"] = zeros(param.shape(), DType::f32, device);
}

void Adafactor::shard_rows(RowShards shards) {
  MT_CHECK(shards.row_bounds && shards.gather, "Adafactor::shard_rows", "row_bounds and gather must both be set");
  for (const ParamGroup& g : param_groups())
    for (const Tensor& p : g.params)
      MT_CHECK(p.device().is_cpu() || p.device().is_meta(), "Adafactor::shard_rows",
               "a parameter is on {}: the row-shard step exchanges its statistics from host memory (CPU or meta "
               "parameters only)", p.device().str());
  shards_ = std::move(shards);
}

StepReport Adafactor::step_all() { return shards_.gather ? step_row_shards() : Optimizer::step_all(); }

namespace {

// A state tensor by name, undefined when this parameter has none (Optimizer::ParamState, protected there).
template <typename State>
Tensor state_tensor(const State& state, const char* name) {
  const auto it = state.tensors.find(name);
  return it == state.tensors.end() ? Tensor() : it->second;
}

}  // namespace

void Adafactor::update(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state) {
  ::memtrain::detail::backend_for(param.device())
      .adafactor_step(param, grad, state_tensor(state, "exp_avg_sq_row"), state_tensor(state, "exp_avg_sq_col"),
                      state_tensor(state, "exp_avg_sq"), state_tensor(state, "exp_avg"), group.lr, group.weight_decay,
                      group.beta1, options_.decay_rate, options_.eps1, options_.clip_threshold, state.step);
}

void Adafactor::update_narrow(Tensor& param, const Tensor& grad, const ParamGroup& group, ParamState& state,
                              const NarrowStep& narrow) {
  MT_CHECK(param.is_contiguous(), "Adafactor", "param {} is bf16 and non-contiguous (shape {})", narrow.index,
           shape_str(param.shape()));
  ::memtrain::detail::backend_for(param.device())
      .adafactor_step_bf16(param.detach(), grad, state_tensor(state, "exp_avg_sq_row"),
                           state_tensor(state, "exp_avg_sq_col"), state_tensor(state, "exp_avg_sq"),
                           state_tensor(state, "exp_avg"), group.lr, group.weight_decay, group.beta1,
                           options_.decay_rate, options_.eps1, options_.clip_threshold, state.step,
                           narrow.compensation, narrow.rule.seed, rounding_stream(narrow.index, state.step),
                           narrow.rule.slice_elements);
}

}  // namespace memtrain::optim
