// Backward engine. See include/memtrain/autograd/engine.h.
#include "memtrain/autograd/engine.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/ops/dispatch_modes.h"
#include "memtrain/ops/elementwise.h"

#include <queue>
#include <unordered_map>

namespace memtrain::autograd {

namespace {

struct NewestFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

// Adds g into slot, taking it over when the slot is empty. A slot no one else sees gets g added in place, so a
// second contribution (a tied weight's head and embedding gradients) never makes a third full tensor.
void accumulate(Tensor& slot, const Tensor& g) {
  if (!g.defined()) return;
  if (!slot.defined()) slot = g;
  else if (slot.dtype() == g.dtype() && slot.shape() == g.shape() && sole_owner(slot)) ops::add_(slot, g);
  else slot = ops::add(slot, g);
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  MT_CHECK(roots.size() == grads.size(), "backward", "{} roots but {} gradients", roots.size(), grads.size());
  NoGradGuard no_grad;
  ops::CastModeGuard no_cast(nullptr);  // no autocast: gradients keep the dtypes the forward gave them
  CategoryGuard category(MemoryCategory::gradients);

  // Dependencies: how many edges point at each node reachable from the roots.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<Node*> stack;
  std::vector<std::shared_ptr<Node>> keep_alive;  // a node must outlive its buffer entry
  for (std::size_t i = 0; i < roots.size(); ++i) {
    Edge edge = gradient_edge(roots[i]);
    MT_CHECK(edge.valid(), "backward", "root {} (shape {}) does not require grad", i, shape_str(roots[i].shape()));
    MT_CHECK(grads[i].shape() == roots[i].shape(), "backward", "gradient of shape {} for a root of shape {}",
             shape_str(grads[i].shape()), shape_str(roots[i].shape()));
    auto& buf = buffers[edge.node.get()];
    buf.resize(edge.node->outputs.size());
    accumulate(buf[edge.input_nr], grads[i]);
    if (dependencies.emplace(edge.node.get(), 0).second) {
      stack.push_back(edge.node.get());
      keep_alive.push_back(edge.node);
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges) {
      if (!e.valid()) continue;
      if (dependencies.emplace(e.node.get(), 0).second) stack.push_back(e.node.get());
      ++dependencies[e.node.get()];
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, NewestFirst> ready;
  for (auto& [node, count] : dependencies)
    if (count == 0) ready.push(node);

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> inputs = std::move(buffers[node]);
    buffers.erase(node);
    inputs.resize(node->outputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].defined()) {
        const OutputInfo& info = node->outputs[i];
        inputs[i] = zeros(info.shape, info.dtype, info.device);
      }
    }
    // Keep the edges' targets alive while we hand them gradients, even if release() drops the last owner.
    const std::vector<Edge> edges = node->next_edges;
    std::vector<Tensor> outputs;
    if (node->adds_into()) {
      // Offer each input's gradient gathered so far, where nothing else sees it, for the node to add into.
      std::vector<Tensor> into(edges.size());
      for (std::size_t i = 0; i < edges.size(); ++i) {
        if (!edges[i].valid()) continue;
        const auto found = buffers.find(edges[i].node.get());
        if (found == buffers.end() || found->second.size() <= edges[i].input_nr) continue;
        const Tensor& slot = found->second[edges[i].input_nr];
        if (slot.defined() && sole_owner(slot)) into[i] = slot;
      }
      outputs = node->apply_into(std::move(inputs), into);
    } else {
      outputs = node->apply(std::move(inputs));
    }
    inputs.clear();
    if (!retain_graph) node->release();
    MT_CHECK(outputs.size() == edges.size() || edges.empty(), node->name(),
             "backward returned {} gradients for {} inputs", outputs.size(), edges.size());
    for (std::size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      if (outputs[i].defined()) {
        const OutputInfo& info = e.node->outputs[e.input_nr];
        MT_CHECK(outputs[i].shape() == info.shape, node->name(),
                 "backward produced a gradient of shape {} for input {} of shape {}", shape_str(outputs[i].shape()),
                 i, shape_str(info.shape));
        auto& buf = buffers[e.node.get()];
        buf.resize(e.node->outputs.size());
        accumulate(buf[e.input_nr], outputs[i]);
        outputs[i] = Tensor();
      }
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
}

void zero_grad(const std::vector<Tensor>& params, bool set_to_none) {
  for (Tensor p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else g.zero_();
  }
}

}  // namespace memtrain::autograd
