#include "memtrain/autograd/node.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/storage.h"
#include "memtrain/ops/elementwise.h"

namespace memtrain::autograd {

namespace {
std::atomic<std::uint64_t> g_next_sequence_nr{0};

AutogradMeta& meta_of(TensorImpl& impl) {
  if (!impl.autograd) impl.autograd = std::make_shared<AutogradMeta>();
  return *impl.autograd;
}

std::shared_ptr<Node> grad_accumulator(const std::shared_ptr<TensorImpl>& leaf) {
  AutogradMeta& meta = meta_of(*leaf);
  if (auto existing = meta.grad_accumulator.lock()) return existing;
  auto acc = std::make_shared<AccumulateGrad>(leaf);
  acc->outputs.push_back({leaf->shape, leaf->dtype, leaf->storage->device()});
  meta.grad_accumulator = acc;
  return acc;
}
}  // namespace

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
  return apply_into(std::move(grads), std::vector<Tensor>(next_edges.size()));
}

std::vector<Tensor> FunctionNode::apply_into(std::vector<Tensor>&& grads, const std::vector<Tensor>& into) {
  MT_CHECK(fn_ != nullptr || into_fn_ != nullptr, name_,
           "backward through the graph a second time: its saved tensors were freed; pass retain_graph=true to "
           "the first backward");
  return fn_ ? fn_(grads) : into_fn_(grads, into);
}

bool sole_owner(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous() && t.offset() == 0 &&
         t.nbytes() == t.storage()->nbytes();
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor& g = grads.at(0);
  AutogradMeta& meta = meta_of(*leaf_);
  MT_CHECK(g.shape() == leaf_->shape, "AccumulateGrad", "gradient of shape {} for a parameter of shape {}",
           shape_str(g.shape()), shape_str(leaf_->shape));
  if (g.dtype() != leaf_->dtype) g = g.to(leaf_->dtype);
  if (!meta.grad.defined()) {
    // Take the gradient over when nothing else can see its storage; otherwise own a copy.
    meta.grad = sole_owner(g) ? g.detach() : g.detach().clone();
  } else {
    ops::add_(meta.grad, g);
  }
  Tensor leaf(leaf_);
  for (auto& hook : meta.grad_ready_hooks) hook(leaf);
  return {};
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.impl().autograd) return {};
  AutogradMeta& meta = *t.impl().autograd;
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  if (meta.requires_grad) return {grad_accumulator(t.impl_ptr()), 0};
  return {};
}

namespace {

// A recorded output made outside any CategoryGuard is forward memory kept for (or on the way to) backward:
// it counts as activations, as the Trainer's guard would count it. Bytes a guard placed (even under `other`)
// and views of an input's storage (a parameter's transpose) keep their category.
void count_as_activations(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  if (category_guard_active()) return;
  for (const Tensor& out : outputs) {
    if (!out.defined() || !out.storage() || out.storage()->category() != MemoryCategory::other) continue;
    bool view = false;
    for (const Tensor& in : inputs) view = view || (in.defined() && in.shares_storage_with(out));
    if (!view) out.storage()->set_category(MemoryCategory::activations);
  }
}

// Wires a new node to its inputs' gradient edges and marks `outputs` as its results.
std::shared_ptr<Node> connect(std::shared_ptr<FunctionNode> node, const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& outputs) {
  count_as_activations(inputs, outputs);
  node->next_edges.reserve(inputs.size());
  for (const Tensor& in : inputs) node->next_edges.push_back(in.requires_grad() ? gradient_edge(in) : Edge{});
  for (std::uint32_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->outputs.push_back({out.shape(), out.dtype(), out.device()});
    AutogradMeta& meta = meta_of(out.impl());
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = i;
  }
  return node;
}

}  // namespace

std::shared_ptr<Node> record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             BackwardFn fn) {
  return connect(std::make_shared<FunctionNode>(std::move(name), std::move(fn)), inputs, outputs);
}

std::shared_ptr<Node> record_into(std::string name, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& outputs, BackwardIntoFn fn) {
  return connect(std::make_shared<FunctionNode>(std::move(name), std::move(fn)), inputs, outputs);
}

}  // namespace memtrain::autograd
