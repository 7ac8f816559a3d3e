// The autograd half of Tensor's methods.
#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/node.h"
#include "memtrain/core/tensor.h"

namespace memtrain {

using autograd::AutogradMeta;

namespace {
AutogradMeta& meta_of(const Tensor& t) {
  TensorImpl& impl = t.impl();
  if (!impl.autograd) impl.autograd = std::make_shared<AutogradMeta>();
  return *impl.autograd;
}
}  // namespace

bool Tensor::requires_grad() const { return impl().autograd && impl().autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool value) {
  MT_CHECK(is_leaf() || value, "set_requires_grad", "cannot turn off requires_grad of a non-leaf tensor; use detach()");
  MT_CHECK(!value || is_floating(dtype()), "set_requires_grad", "only floating tensors can require grad, got {}",
           dtype_name(dtype()));
  meta_of(*this).requires_grad = value;
  return *this;
}

bool Tensor::is_leaf() const { return !impl().autograd || impl().autograd->grad_fn == nullptr; }

Tensor Tensor::grad() const { return impl().autograd ? impl().autograd->grad : Tensor(); }

void Tensor::set_grad(const Tensor& g) {
  if (g.defined())
    MT_CHECK(g.shape() == shape(), "set_grad", "gradient shape {} differs from tensor shape {}", shape_str(g.shape()),
             shape_str(shape()));
  meta_of(*this).grad = g;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  return impl().autograd ? impl().autograd->grad_fn : nullptr;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor g = gradient;
  if (!g.defined()) {
    MT_CHECK(numel() == 1, "backward", "a gradient must be given for a non-scalar root of shape {}",
             shape_str(shape()));
    g = ones(shape(), dtype(), device());
  }
  autograd::backward({*this}, {g}, retain_graph);
}

void Tensor::register_grad_ready_hook(std::function<void(Tensor&)> hook) {
  MT_CHECK(is_leaf() && requires_grad(), "register_grad_ready_hook",
           "hooks go on leaf tensors that require grad (parameters)");
  meta_of(*this).grad_ready_hooks.push_back(std::move(hook));
}

Tensor Tensor::detach() const {
  auto copy = std::make_shared<TensorImpl>(impl());
  copy->autograd = nullptr;
  return Tensor(std::move(copy));
}

}  // namespace memtrain
