// Saved tensors go through one door. A backward rule that needs a tensor later wraps it in a SavedTensor;
// construction asks the innermost SavedTensorHooks on this thread (if any) to pack it, and unpack() asks
// the same hooks to give it back. With no hooks the tensor is simply kept (detached, so a node never
// owns its own output's history). Checkpoint policies and offload plug in here.
//
// A saved tensor that is cheap and exact to make again from a tensor kept anyway (under amp::Autocast, a
// parameter's low-precision copy, cast again from the parameter) need not be kept at all: with no hooks
// installed, SavedTensor asks the innermost TensorRemaker on this thread for a recipe and keeps that instead of
// the bytes, which unpack() then makes again. Hooks see every save as before (a checkpointed region drops such
// a copy with the rest and its re-run makes it again).
#pragma once

#include "memtrain/core/tensor.h"

#include <functional>
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

class TensorRemaker {
 public:
  virtual ~TensorRemaker() = default;
  // A function that returns `tensor`'s values again (same shape, strides, offset and dtype, in new storage), or
  // an empty function when `tensor` is not one this remaker can make.
  virtual std::function<Tensor()> recipe(const Tensor& tensor) = 0;
};

// Installs `remaker` for SavedTensors created on this thread while the guard lives (it must outlive the guard;
// the recipes it hands out must not refer to it); guards nest, and a null remaker turns remaking off.
class TensorRemakerGuard {
 public:
  explicit TensorRemakerGuard(TensorRemaker* remaker);
  ~TensorRemakerGuard();
  TensorRemakerGuard(const TensorRemakerGuard&) = delete;
  TensorRemakerGuard& operator=(const TensorRemakerGuard&) = delete;

 private:
  TensorRemaker* previous_;
};

class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& tensor);
  Tensor unpack() const;  // throws once released
  void release();
  bool defined() const { return kept_.defined() || handle_ != nullptr || remake_ != nullptr; }

 private:
  Tensor kept_;
  std::function<Tensor()> remake_;  // a TensorRemaker's recipe, kept instead of the bytes
  std::shared_ptr<SavedTensorHooks> hooks_;
  std::shared_ptr<void> handle_;
  bool was_defined_ = false;
};

}  // namespace memtrain::autograd
