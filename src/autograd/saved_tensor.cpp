#include "memtrain/autograd/saved_tensor.h"

namespace memtrain::autograd {

namespace {
thread_local std::shared_ptr<SavedTensorHooks> t_hooks;
thread_local TensorRemaker* t_remaker = nullptr;
}

SavedTensorHooksGuard::SavedTensorHooksGuard(std::shared_ptr<SavedTensorHooks> hooks) : previous_(std::move(t_hooks)) {
  t_hooks = std::move(hooks);
}
SavedTensorHooksGuard::~SavedTensorHooksGuard() { t_hooks = std::move(previous_); }
std::shared_ptr<SavedTensorHooks> current_saved_tensor_hooks() { return t_hooks; }

TensorRemakerGuard::TensorRemakerGuard(TensorRemaker* remaker) : previous_(t_remaker) { t_remaker = remaker; }
TensorRemakerGuard::~TensorRemakerGuard() { t_remaker = previous_; }

SavedTensor::SavedTensor(const Tensor& tensor) : was_defined_(tensor.defined()) {
  if (!tensor.defined()) return;
  if (t_hooks) {
    hooks_ = t_hooks;
    handle_ = hooks_->pack(tensor);
    return;
  }
  if (t_remaker) remake_ = t_remaker->recipe(tensor);
  if (!remake_) kept_ = tensor.detach();
}

Tensor SavedTensor::unpack() const {
  if (!was_defined_) return Tensor();
  MT_CHECK(defined(), "SavedTensor::unpack",
           "the saved tensor was already freed: backward through the graph a second time needs retain_graph=true");
  if (hooks_) return hooks_->unpack(handle_);
  if (remake_) return remake_();
  return kept_;
}

void SavedTensor::release() {
  kept_ = Tensor();
  handle_.reset();
  hooks_.reset();
  remake_ = nullptr;
}

}  // namespace memtrain::autograd
