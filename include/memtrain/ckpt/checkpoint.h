// Activation checkpointing: ckpt::checkpoint(fn, inputs) runs fn without keeping the tensors its ops save
// for backward; backward re-runs fn's forward once, under the same RNG state, to get them back.
//
// How (the non-reentrant scheme of DESIGN.md): the forward records fn's nodes on the tape as usual, but every
// tensor an op saves inside the region passes through the region's SavedTensorHooks, which keep it or drop it.
// A dropped one becomes a placeholder holding its position in the region's save order. The first time backward
// unpacks a placeholder, the region re-runs fn on detached copies of its inputs (same requires_grad), with the
// RNG stream set back to where the forward started it, grad mode on; the k-th tensor saved during the re-run
// fills placeholder k. The re-run's own graph is thrown away, and it stops as soon as the last placeholder is
// filled (matmul, linear and conv2d save their operands before they compute, so a re-run whose last dropped
// tensor is the input of the region's last projection stops before that GEMM). The original nodes then run
// their backward unchanged, so dropout, captured parameters and nesting need nothing special, and gradients are
// bit-identical to the run without checkpointing (the kernels are deterministic).
//
// What is kept: parameters (leaves that require grad: they are alive anyway), the region's inputs (held by the
// region itself, through the enclosing hooks so an outer region may drop them in turn) and, when the region
// names expensive ops (RegionOptions::keep_ops, "selective" checkpointing), the outputs of those ops that some
// op inside the region saved (an output nothing saved, such as a projection feeding a residual add, is let go
// after the forward: keeping it would hold bytes that no checkpointing would not). Kept outputs are also handed
// back to the re-run in place of recomputing them: matmul, linear, attention and conv2d ask the region
// (compute_or_replay, below; the region is their ops::RecomputeMode) before they compute. A keep-list entry
// names an op ("linear"), an op under a label that the calling module set ("linear@mlp.fc"), or any op under
// a label ("@mlp.fc"): see op_label.h.
//
// Contract on fn: it must run the same ops in the same order when called again with the same inputs and RNG
// state (no data-dependent control flow on values that change in between, no in-place writes to its inputs or
// to captured tensors between forward and backward). A mismatch found during the re-run throws.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace memtrain::ckpt {

// Ops whose outputs "selective" checkpointing keeps by default: the ones whose recomputation costs FLOPs rather
// than a pass over memory.
const std::vector<std::string>& default_keep_ops();

struct RegionOptions {
  // Entries "op", "op@label" or "@label" (op_label.h); checkpoint() throws on a malformed one.
  std::vector<std::string> keep_ops;     // ops whose outputs stay saved; empty = keep nothing (full)
  std::vector<std::string> profile_ops;  // what the profile counts as expensive; empty = keep_ops (see below)
};

// What one region saw during its forward: the bytes each kind of saved tensor holds (distinct storages, so
// views of one buffer count once) and the work a re-run would redo. Parameters are not counted.
// "Expensive ops" below are profile_ops, else keep_ops, else default_keep_ops() (the first non-empty list).
struct RegionProfile {
  std::size_t input_bytes = 0;      // the region's inputs, which the region keeps
  std::size_t saved_bytes = 0;      // what ops saved besides inputs: what the region would keep without checkpointing
  std::size_t expensive_bytes = 0;  // outputs of expensive ops that some op saved: what selective keeps besides inputs
  std::size_t cheap_saved_bytes = 0;  // saved, not an input, not an expensive output: what selective drops
  std::size_t dropped_bytes = 0;    // what this region actually dropped
  double expensive_flops = 0;       // FLOPs of the expensive ops (matmul: 2*M*N*K, ...)
  // What a re-run computes again. It stops at the last tensor it must save again, so expensive ops after that
  // (a last projection whose input is saved before it multiplies) are never redone.
  double full_rerun_flops = 0;      // full: the expensive ops before the region's last dropped save
  double unsaved_expensive_flops = 0;  // selective: those whose outputs nothing saved, before the last cheap save
  std::int64_t saved_tensors = 0;   // SavedTensors created inside the region
  std::int64_t dropped_tensors = 0;
};

using RegionFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs fn(inputs) as a checkpointed region and returns its outputs (with their normal autograd history).
// Inputs may or may not require grad; undefined inputs are passed through as undefined.
std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs, const RegionOptions& options = {},
                               RegionProfile* profile = nullptr);
// One input, one output.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const RegionOptions& options = {}, RegionProfile* profile = nullptr);

// True while some region's forward is being re-run on this thread (during backward). Modules with side effects
// in their forward skip them then: batch norm does not update its running statistics twice.
bool in_rerun();

// Process-wide counters (all threads), for reports and tests.
struct Counters {
  std::int64_t regions = 0;     // checkpoint() calls
  std::int64_t recomputes = 0;  // forward re-runs during backward
  double recomputed_flops = 0;  // FLOPs of the expensive ops (see compute_or_replay) those re-runs computed again
};
Counters counters();

namespace detail {
// For ops with expensive forwards (matmul, linear, attention, conv2d): a region installs itself as the ops'
// RecomputeMode (ops/dispatch_modes.h) for its forward and its re-run, and the ops consult that; this function
// is the same door for code above the ops (amp's fp8_linear, tests). The op is matched against the keep and
// profile lists together with the current OpLabel (op_label.h). Inside the re-run of a region whose keep_ops
// cover it, returns the outputs the forward kept (the next ones in order; a different op or label there throws)
// without calling compute. Otherwise returns compute() and, in a region's forward, notes the outputs for the
// profile (expensive ops, see RegionProfile) and keeps them when keep_ops cover the op. `flops` feeds the
// profile. Outside any region: just compute().
std::vector<Tensor> compute_or_replay(std::string_view op, double flops,
                                      const std::function<std::vector<Tensor>()>& compute);
}  // namespace detail

}  // namespace memtrain::ckpt
