// The tape: each op that needs a gradient records a Node whose apply() maps the gradients of its outputs
// to the gradients of its inputs. Edges point to the nodes of the inputs; leaves that require grad end
// in an AccumulateGrad node that adds into their .grad and fires their gradient-ready hooks.
#pragma once

#include "memtrain/core/tensor.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace memtrain::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
  std::uint32_t input_nr = 0;  // which output of `node` the gradient belongs to
  bool valid() const { return node != nullptr; }
};

struct OutputInfo {
  Shape shape;
  DType dtype;
  Device device;
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string_view name() const = 0;
  // grads[i]: gradient of output i (the engine passes zeros for outputs that received none).
  // Returns one gradient per entry of next_edges (undefined where the edge is invalid).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // The engine's offer, for nodes that take it (adds_into() true): into[i] (one per next_edges entry) is the
  // gradient already gathered for input i where one exists and nothing else sees it, else undefined. The node
  // may add its gradient for input i into into[i] and return an undefined tensor for i instead.
  virtual bool adds_into() const { return false; }
  virtual std::vector<Tensor> apply_into(std::vector<Tensor>&& grads, const std::vector<Tensor>& into) {
    (void)into;
    return apply(std::move(grads));
  }
  // Drops what the node saved for backward (called right after apply unless retain_graph).
  virtual void release() {}

  std::vector<Edge> next_edges;
  std::vector<OutputInfo> outputs;
  const std::uint64_t sequence_nr;  // creation order: later nodes run first in backward
};

// Gradient rule written with ops, given the output gradients.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;

// A gradient rule that may add its gradient for input i into into[i] (Node::apply_into) and return an undefined
// tensor for i: an embedding scatters its rows into the tied head's gradient instead of making a dense one.
using BackwardIntoFn =
    std::function<std::vector<Tensor>(const std::vector<Tensor>& grads, const std::vector<Tensor>& into)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  FunctionNode(std::string name, BackwardIntoFn fn) : name_(std::move(name)), into_fn_(std::move(fn)) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  bool adds_into() const override { return into_fn_ != nullptr; }
  std::vector<Tensor> apply_into(std::vector<Tensor>&& grads, const std::vector<Tensor>& into) override;
  // Destroying the closure frees every SavedTensor it captured.
  void release() override {
    fn_ = nullptr;
    into_fn_ = nullptr;
  }

 private:
  std::string name_;
  BackwardFn fn_;            // one of the two is set
  BackwardIntoFn into_fn_;
};

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string_view name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;       // null for leaves
  std::uint32_t output_nr = 0;         // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // leaves only; created on first use
  std::vector<std::function<void(Tensor&)>> grad_ready_hooks;
};

// True when nothing but `t` can see its bytes (its own handle, a storage of its own, dense over all of it), so a
// gradient may be taken over or added into in place.
bool sole_owner(const Tensor& t);

// True when grad mode is on and any input requires grad: then the op must call record().
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Connects `outputs` to a new FunctionNode whose backward is `fn`, with one edge per input. Call only when
// needs_grad(inputs). Returns the node.
std::shared_ptr<Node> record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             BackwardFn fn);
// The same, with a rule that may add into the engine's offered gradients (BackwardIntoFn).
std::shared_ptr<Node> record_into(std::string name, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& outputs, BackwardIntoFn fn);

// The edge that a gradient for `t` flows into (its grad_fn, its accumulator, or none).
Edge gradient_edge(const Tensor& t);

}  // namespace memtrain::autograd
