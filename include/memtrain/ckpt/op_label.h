// Op labels: a thread-local name that a module sets around the ops it calls, so that a selective checkpoint can
// tell apart ops of one kind (all four GPT-2 projections are "linear"; "mlp.fc" names one of them).
//
//   { ckpt::OpLabel label("mlp.fc"); h = c_fc_->forward(x); }  // ops in this scope report the label "mlp.fc"
//
// Labels do not compose: an inner OpLabel replaces the outer one for its scope and restores it on exit (also
// when an exception unwinds). Ops that ask checkpointing before computing (ckpt::detail::compute_or_replay)
// see the current label next to their op name; a region's re-run sets the same labels as its forward, because
// it runs the same module code.
//
// Keep-list entries (RegionOptions::keep_ops, Policy::selective, "selective:..." strings) refer to ops by:
//   op          that op under any label, or none ("linear": every linear; what entries meant before labels)
//   op@label    that op only while `label` is current ("linear@mlp.fc")
//   @label      any reporting op while `label` is current ("@attn.q": the projection whichever op computes it,
//               linear when it has a bias, matmul when it has none)
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace memtrain::ckpt {

class OpLabel {
 public:
  explicit OpLabel(std::string label);  // an empty label means "no label" for the scope
  ~OpLabel();
  OpLabel(const OpLabel&) = delete;
  OpLabel& operator=(const OpLabel&) = delete;

 private:
  std::string label_;
  const std::string* previous_;
};

// The label of the innermost live OpLabel on this thread; empty when none.
std::string_view current_op_label();

// fn() with `label` current: Tensor h = ckpt::labelled("mlp.fc", [&] { return c_fc_->forward(x); });
template <class Fn>
auto labelled(std::string label, Fn&& fn) {
  const OpLabel scope(std::move(label));
  return fn();
}

// Throws memtrain::Error(where, ...) naming `entry` unless it has one of the three forms above: a non-empty op,
// or at most one '@' followed by a non-empty label.
void check_keep_entry(std::string_view entry, std::string_view where);

// Whether a well-formed keep-list entry covers op `op` running under label `label` ("" = none).
bool keep_entry_matches(std::string_view entry, std::string_view op, std::string_view label);

}  // namespace memtrain::ckpt
