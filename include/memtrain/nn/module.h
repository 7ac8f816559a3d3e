// Module: the base of every nn layer. A module owns named parameters (leaf tensors that require grad,
// allocated as MemoryCategory::parameters), named buffers (state that is saved but not trained) and named
// submodules. Names nest with dots, e.g. "h.0.attn.c_attn.weight", in registration order, as in PyTorch.
//
// Layers keep their own Tensor handles to what they register; a handle shares storage with the registry's,
// so load_state_dict (which copies values into the existing storage) is seen by both. Module::to moves the
// data in place (Tensor::set_data_ on the shared TensorImpl), so the layers' handles follow it too.
// Forward signatures differ per layer, so there is no virtual forward here.
#pragma once

#include "memtrain/ckpt/policy.h"
#include "memtrain/core/dtype.h"
#include "memtrain/core/scoped_thread_value.h"
#include "memtrain/core/tensor.h"
#include "memtrain/core/tensor_source.h"

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace memtrain::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using StateDict = std::map<std::string, Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters of this module and (recursively) its submodules, each once even when shared (tied weights).
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }

  // Training mode (dropout active) is the default; both calls recurse into submodules.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  std::int64_t num_parameters() const;  // elements over unique parameters

  // Moves every parameter and buffer (recursively, each once: tied weights move once) to `device`, in place:
  // every handle to a parameter (the layers', an optimizer's) sees the moved data, parameters stay leaves that
  // require grad, and their bytes are accounted under MemoryCategory::parameters on the new device (buffers
  // keep their category). Gradients move along (MemoryCategory::gradients). Tensors already on `device` are
  // left as they are (same storage), so to(device()) is a no-op. All copies are made before any tensor is
  // switched, so a failure (out of memory) leaves the module as it was. Views taken before the move (an old
  // state_dict()) keep the old data. Throws memtrain::Error naming the device when it is not usable (CUDA
  // absent, not built, or the index out of range). Returns *this.
  Module& to(Device device);
  // Where the parameters and buffers live: CPU for a module that has none; throws when they are spread over
  // several devices (naming two tensors on different ones).
  Device device() const;
  void zero_grad();                     // clears every parameter's gradient
  // Activation checkpointing of the model's blocks (ckpt/policy.h). Walks the module tree from here, offering
  // the policy to each module through apply_checkpointing; a module that takes it runs its own blocks under it,
  // and its subtree is not walked further (each module shared by two parents is offered it once). Policy none
  // always succeeds and resets every module that takes policies. Any other policy that no module takes throws
  // memtrain::Error naming it: the model declares no checkpointable blocks (put them in an nn::Sequential, or
  // override apply_checkpointing in the module that runs them).
  void set_checkpointing(ckpt::Policy policy);

  // name -> tensor for every parameter and buffer; the tensors are detached views of the live storage.
  StateDict state_dict() const;
  // Copies values (converting dtype) into the existing parameters and buffers, preserving their storage.
  // Every entry is checked before anything is copied: a shape mismatch always throws memtrain::Error; with
  // strict, so do keys the model has but `dict` lacks (missing) and keys `dict` has but the model lacks
  // (unexpected). The message names each offending key (and both shapes for a mismatch). Each value is read
  // from the source straight into its parameter or buffer: a file's tensors are not held in memory first.
  void load_state_dict(const TensorSource& source, bool strict = true);
  void load_state_dict(const StateDict& dict, bool strict = true) { load_state_dict(MapTensorSource(dict), strict); }
  // state_dict() written to a safetensors file (atomically: temp file + rename; io/safetensors.h), in name
  // order, with the metadata {"format": "pt"} so that Python's safetensors loads it as PyTorch tensors.
  void save(const std::string& path) const;
  // load_state_dict(the tensors of a safetensors file, strict): the same checks, the message naming the file.
  void load(const std::string& path, bool strict = true);

 protected:
  // A new parameter of `shape` allocated under MemoryCategory::parameters (uninitialised contents), on the
  // CPU or on the device of this thread's ParameterDeviceGuard.
  static Tensor new_parameter(const Shape& shape, DType dtype);
  // Registers t (made a leaf that requires grad) under `name` and returns the same handle. Its storage is
  // accounted under MemoryCategory::parameters from now on, however it was made (zeros(), randn(), a load).
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  // Points the registry's parameter `name` of this module at `t` (same shape, any floating dtype), keeping
  // whether it requires grad; the caller swaps its own handle too. For a frozen weight stored in another
  // dtype (nn::Linear under LoRA). Throws naming the parameter when it is absent or the shape differs.
  Tensor replace_parameter(const std::string& name, Tensor t);
  // Drops parameter `name` of this module from the registry (a frozen weight stored another way, as NF4
  // buffers under LoRA) and returns it. Throws naming it when absent.
  Tensor remove_parameter(const std::string& name);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // set_checkpointing's hook: a module that runs checkpointable blocks (through a ckpt::BlockCheckpointer)
  // sets its policy and returns true; the default takes none and returns false, so the walk goes on into the
  // submodules. Called with Policy::none() too, to reset.
  virtual bool apply_checkpointing(const ckpt::Policy& policy);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  // Offers the policy to this module, then to its submodules unless it took it; true when one took it.
  bool offer_checkpointing(const ckpt::Policy& policy, std::set<const Module*>& seen);
  void collect(const std::string& prefix, bool buffers, NamedTensors& out) const;

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Initialisers used by the layers (GPT-2 style), in place and not recorded by autograd.
void init_normal_(Tensor& t, double std);  // normal(0, std) from the default RNG stream

// Modules built on this thread while the guard lives make their parameters on `device` instead of the CPU.
// Under ParameterDeviceGuard(Device::meta()) a model costs no memory and no time to build and initialise (the
// random draws still advance the RNG stream as on the CPU): what train::predict_memory builds. Buffers that a
// module makes outside new_parameter stay on the CPU until Module::to moves them.
class ParameterDeviceGuard : public ScopedThreadValue<Device> {
 public:
  explicit ParameterDeviceGuard(Device device);
};

}  // namespace memtrain::nn
