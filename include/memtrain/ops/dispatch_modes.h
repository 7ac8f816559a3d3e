// Dispatch modes: how techniques above the ops (amp's autocast, ckpt's checkpoint regions) reach into them
// without the ops knowing those techniques, in the way of PyTorch's dispatch keys and TorchDispatchMode.
// The ops declare here what they consult; a technique implements the interface and installs an instance
// for a scope with the guard:
//
//   class MyCast final : public ops::CastMode { ... };   // in amp/, ckpt/ or a test
//   MyCast mode;
//   { ops::CastModeGuard guard(&mode); y = ops::linear(x, w, b); }   // linear asks `mode` first
//
// Each kind of mode is one thread-local "current" pointer: a guard installs its mode (or nullptr, which
// suspends that kind of mode) and restores the previous one when it ends, so guards nest like scopes and a
// thread that installed nothing (a data loader's prefetch thread) sees no mode. With none installed an op
// pays one thread-local load per consultation.
//
// Who installs what:
//   CastMode       amp::Autocast (amp/autocast.h); the backward engine suspends it (nullptr) while
//                  gradients are computed, so they keep the dtypes the forward gave them.
//   RecomputeMode  ckpt::checkpoint (ckpt/checkpoint.h), for a region's forward and for its re-run.
#pragma once

#include "memtrain/core/scoped_thread_value.h"
#include "memtrain/core/tensor.h"

#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace memtrain::ops {

// Precision policy. Each method answers nullopt for "run the op as called".
class CastMode {
 public:
  virtual ~CastMode() = default;
  // The inputs of an op that runs in the low-precision compute dtype (matmul, linear, conv2d, attention,
  // embedding's output), cast; `inputs` may hold undefined tensors (an absent bias), to be kept as they are.
  virtual std::optional<std::vector<Tensor>> to_compute(const std::vector<Tensor>& inputs) = 0;
  // The inputs of an op that must run in f32 (softmax, log_softmax, cross_entropy), cast up.
  virtual std::optional<std::vector<Tensor>> to_f32(const std::vector<Tensor>& inputs) = 0;
  // linear computed by the mode itself (e.g. in FP8); asked before to_compute. bias may be undefined.
  virtual std::optional<Tensor> linear(const Tensor& x, const Tensor& weight, const Tensor& bias) = 0;
  // The dtype to_compute casts floating inputs to, for an op that casts an operand itself a piece at a time
  // (the fused LM head casts its weight a block of rows at a time, never whole); nullopt when the mode does
  // not say, and such an op then runs uncast.
  virtual std::optional<DType> compute_dtype() const { return std::nullopt; }
  // The operands of a binary elementwise op (add, sub, mul, div) whose dtypes differ, cast to the one dtype
  // the op is to run in; nullopt leaves them as they are, and the op refuses the mismatch. The default
  // promotes nothing.
  virtual std::optional<std::vector<Tensor>> promote(const std::vector<Tensor>& inputs) {
    (void)inputs;
    return std::nullopt;
  }
};

// Recomputation policy for ops with expensive forwards (matmul, linear, scaled_dot_product_attention,
// conv2d): the op hands over its forward instead of running it, so that a mode may note or keep the outputs,
// or hand back outputs kept earlier in place of computing them.
class RecomputeMode {
 public:
  virtual ~RecomputeMode() = default;
  // The op's outputs: compute()'s, or ones the mode kept. `op` names the op ("linear"); `flops` is what
  // compute() costs (matmul: 2*M*N*K).
  virtual std::vector<Tensor> compute_or_replay(std::string_view op, double flops,
                                                const std::function<std::vector<Tensor>()>& compute) = 0;
};

// Installs `mode` (not owned; nullptr suspends that kind of mode) on this thread until the guard ends, then
// puts back the one it replaced. Mode: CastMode or RecomputeMode (the two instantiations).
template <class Mode>
class ModeGuard : public ScopedThreadValue<Mode*> {
 public:
  explicit ModeGuard(Mode* mode);
};
extern template class ModeGuard<CastMode>;
extern template class ModeGuard<RecomputeMode>;
using CastModeGuard = ModeGuard<CastMode>;
using RecomputeModeGuard = ModeGuard<RecomputeMode>;

namespace detail {

// The innermost installed mode of this thread; nullptr when none is.
CastMode* current_cast_mode();
RecomputeMode* current_recompute_mode();

// What an op calls to let the current CastMode recast its inputs, e.g.
//   if (auto c = cast_mode_to_compute(x, w, b)) return linear((*c)[0], (*c)[1], (*c)[2]);
// nullopt (without building the vector) when no CastMode is installed.
template <class... T>
std::optional<std::vector<Tensor>> cast_mode_to_compute(const T&... inputs) {
  CastMode* mode = current_cast_mode();
  if (mode == nullptr) return std::nullopt;
  return mode->to_compute({inputs...});
}
template <class... T>
std::optional<std::vector<Tensor>> cast_mode_to_f32(const T&... inputs) {
  CastMode* mode = current_cast_mode();
  if (mode == nullptr) return std::nullopt;
  return mode->to_f32({inputs...});
}
inline std::optional<std::vector<Tensor>> cast_mode_promote(const Tensor& a, const Tensor& b) {
  CastMode* mode = current_cast_mode();
  if (mode == nullptr) return std::nullopt;
  return mode->promote({a, b});
}
inline std::optional<Tensor> cast_mode_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  CastMode* mode = current_cast_mode();
  if (mode == nullptr) return std::nullopt;
  return mode->linear(x, weight, bias);
}

// What an expensive op calls in place of running its forward: compute() directly when no RecomputeMode is
// installed (no std::function is made then), else the mode's answer.
template <class Compute>
std::vector<Tensor> compute_or_replay(std::string_view op, double flops, Compute&& compute) {
  RecomputeMode* mode = current_recompute_mode();
  if (mode == nullptr) return std::forward<Compute>(compute)();
  return mode->compute_or_replay(op, flops, std::function<std::vector<Tensor>()>(std::forward<Compute>(compute)));
}

}  // namespace detail

}  // namespace memtrain::ops
