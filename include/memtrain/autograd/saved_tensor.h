// Saved tensors go through one door. A backward rule that needs a tensor later wraps it in a SavedTensor;
// construction asks the innermost SavedTensorHooks on this thread (if any) to pack it, and unpack() asks
// the same hooks to give it back. With no hooks the tensor is simply kept (detached, so a node never
// owns its own output's history). Checkpoint policies and offload plug in here.
#pragma once

#include "memtrain/core/tensor.h"

#include <memory>

namespace memtrain::autograd {

class SavedTensorHooks {
 public:
  virtual ~SavedTensorHooks() = default;
  // Returns an opaque handle from which unpack() recovers the tensor; may drop the data meanwhile.
  virtual std::shared_ptr<void> pack(const Tensor& tensor) = 0;
  virtual Tensor unpack(const std::shared_ptr<void>& handle) = 0;
};

// Installs hooks for SavedTensors created on this thread while the guard lives; guards nest.
class SavedTensorHooksGuard {
 public:
  explicit SavedTensorHooksGuard(std::shared_ptr<SavedTensorHooks> hooks);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;

 private:
  std::shared_ptr<SavedTensorHooks> previous_;
};
std::shared_ptr<SavedTensorHooks> current_saved_tensor_hooks();

class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& tensor);
  Tensor unpack() const;  // throws once released
  void release();
  bool defined() const { return kept_.defined() || handle_ != nullptr; }

 private:
  Tensor kept_;
  std::shared_ptr<SavedTensorHooks> hooks_;
  std::shared_ptr<void> handle_;
  bool was_defined_ = false;
};

}  // namespace memtrain::autograd
