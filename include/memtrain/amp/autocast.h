// Autocast: run a region's ops in a low-precision compute dtype (bf16 or f16) while the parameters stay
// f32. A guard, usable around any C++ code:
//
//   { amp::Autocast bf16(DType::bf16); loss = model.loss(tokens, targets); }   // forward in bf16
//   loss.backward();                                                         // grads reach f32 weights
//
// Op list (what each op does while a guard is active):
//   low precision  matmul, linear, scaled_dot_product_attention, conv2d: floating inputs are cast to the
//                  compute dtype and the op runs there (f32 accumulation); the output is in the compute dtype.
//                  embedding: the lookup is exact; its output is cast, so the residual stream, and every
//                  activation saved for backward after it, is stored in the compute dtype.
//   f32            softmax, log_softmax, cross_entropy: inputs are cast up to f32 (a loss in bf16 would lose
//                  the small differences training follows). fused_linear_cross_entropy computes the loss in
//                  f32; under ops::HeadGemmsInComputeDtype its GEMMs run in the compute dtype (ops/fused_loss.h).
//   f32 inside     layer_norm, rms_norm: statistics and arithmetic in f32, output in the input's dtype; their
//                  f32 weights are used as they are.
//   promoted       add, sub, mul, div (with broadcasting) of a tensor in the compute dtype and an f32 tensor
//                  (h + pos, x * gain): the f32 operand is cast to the compute dtype (a parameter through the
//                  cache below) and the op runs there, so its output is in the compute dtype. PyTorch's autocast
//                  promotes such a pair to f32 instead; memtrain keeps the residual stream narrow, as the
//                  embedding rule does. Other mixed pairs (bf16 with f16, anything with f64) are refused.
//                  Outside a guard no op promotes: mixed dtypes are an error naming the fix.
//   as given       everything else (elementwise, dropout, views, reductions) runs in its inputs' dtype.
//   fp8 policy     as bf16, except linear: amp::fp8_linear (amp/fp8_linear.h) with FP8 operands.
//
// Compute copies of parameters (leaf tensors that require grad) are made under MemoryCategory::compute_weights
// and shared by every use while they live (a tied embedding and head cast once). How long they live is the
// guard's WeightCasts policy:
//   recast (default)   a copy lives while an op uses it: backward does not keep it but casts the parameter
//                      again when it needs the copy (autograd::TensorRemaker), so about one layer's copies are
//                      alive at a time, in the forward and in backward, for one more cast per weight and step.
//                      Backward then reads the parameter as it is at that moment: change a weight only after
//                      backward has passed it (as optimizers and layer-wise updates do).
//   keep_for_backward  a copy is made once per outermost guard and kept by the guard until its end, and by
//                      backward until the op that saved it has run: every weight's copy is alive at once
//                      between the forward and backward, and each weight is cast once per step.
// Under the fp8 policy the FP8 copies of linear weights follow the same policy: under recast backward quantizes the
// weight again (blockwise: from the weight alone; delayed: with the scale the forward used, recording no amax)
// and keeps only the scales.
// Gradients flow back through the cast: a parameter's .grad() is f32.
// Backward runs with autocast off (autograd::backward suspends the ops' CastMode); an activation-checkpoint
// re-run restores the dtype its region's forward ran with.
// How: a guard installs an ops::CastMode (ops/dispatch_modes.h) for its scope, on its own thread only; the
// ops consult the innermost one and know nothing of amp.
#pragma once

#include "memtrain/amp/precision.h"
#include "memtrain/core/tensor.h"

#include <memory>

namespace memtrain::amp {

class Fp8State;

// What an Autocast guard set: the compute dtype (f32 = off) and, for the fp8 policy, the FP8 state that
// linear layers use. Activation checkpointing records it with a region and restores it for the re-run.
struct AutocastMode {
  DType dtype = DType::f32;
  Fp8State* fp8 = nullptr;
  WeightCasts weight_casts = WeightCasts::recast;
};

class Autocast {
 public:
  // dtype: bf16 or f16 turn autocast on; f32 turns it off inside the guard (a region that must stay f32).
  explicit Autocast(DType dtype = DType::bf16);
  // The fp8 policy: bf16 compute, and every linear (ops::linear) in FP8 with fp8's recipe and scaling state
  // (amp/fp8_state.h), its weights quantized once per guard. fp8 must outlive the guard.
  explicit Autocast(Fp8State& fp8);
  explicit Autocast(const AutocastMode& mode);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  struct Installed;
  std::unique_ptr<Installed> installed_;  // the CastMode this guard installed (none when f32) and its guard
};

// The compute dtype of the innermost active guard; f32 when autocast is off.
DType autocast_dtype();
AutocastMode autocast_mode();
inline bool autocast_enabled() { return autocast_dtype() != DType::f32; }

}  // namespace memtrain::amp
