// Containers: modules that hold other modules, as PyTorch's nn.Sequential and nn.ModuleList.
//   UnaryModule  a module with one input and one output, Tensor forward(const Tensor&)
//   Lambda       a parameter-free step (an activation, a reshape) as a module
//   Sequential   steps run one after the other; each step is one checkpointable block
//   ModuleList   an indexed list of any modules, with no forward of its own
// Children are registered as "0", "1", ... in order, so a Sequential of two Linears names its parameters
// "0.weight", "0.bias", "1.weight", "1.bias", and a step that is a Lambda takes an index too (as ReLU does in
// PyTorch): Sequential(linear, relu, linear) has "0.weight" and "2.weight".
//
// A step of a Sequential is any module with a Tensor forward(const Tensor&) (const or not): nn::Linear,
// nn::LayerNorm, nn::TransformerBlock, a user's block. It is registered as it is (no wrapper between it and
// the Sequential, so no extra name level); the Sequential keeps a callable to its forward.
#pragma once

#include "memtrain/ckpt/policy.h"
#include "memtrain/core/error.h"
#include "memtrain/nn/module.h"

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace memtrain::detail {
// For the nn containers: child i as a T; throws naming `where` and the index when i is out of range, or the
// child's type and T when it is not a T.
[[noreturn]] void container_index_error(const char* where, std::size_t i, std::size_t size);
[[noreturn]] void container_type_error(const char* where, std::size_t i, const nn::Module& child, const char* wanted);
template <typename T>
std::shared_ptr<T> container_child_as(const char* where, const std::vector<std::shared_ptr<nn::Module>>& children,
                                      std::size_t i) {
  if (i >= children.size()) container_index_error(where, i, children.size());
  auto t = std::dynamic_pointer_cast<T>(children[i]);
  if (t == nullptr) container_type_error(where, i, *children[i], typeid(T).name());
  return t;
}
}  // namespace memtrain::detail

namespace memtrain::nn {

// A module whose forward takes one tensor and returns one: what a container can run without knowing its type.
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
};

// A module with `Tensor forward(const Tensor&)`, const or not.
template <typename M>
concept UnaryForward = std::derived_from<M, Module> && requires(M& m, const Tensor& x) {
  { m.forward(x) } -> std::convertible_to<Tensor>;
};

using UnaryFn = std::function<Tensor(const Tensor&)>;

// fn as a module with no parameters; `name` is what describe() shows ("relu", "gelu").
class Lambda : public UnaryModule {
 public:
  explicit Lambda(UnaryFn fn, std::string name = "lambda");
  Tensor forward(const Tensor& x) override { return fn_(x); }
  const std::string& name() const { return name_; }

 private:
  UnaryFn fn_;
  std::string name_;
};

// x -> step_{n-1}(...step_1(step_0(x))). Takes activation checkpointing (Module::set_checkpointing): each
// step is one block of its own ckpt::BlockCheckpointer, so "full" makes every step a region that keeps only
// its input, and every:K, selective and budget:SIZE work as on GPT's transformer blocks. Steps inside a step
// are not offered the policy (the outermost Sequential on each path takes it).
class Sequential : public UnaryModule {
 public:
  Sequential() = default;
  // Sequential(linear, [](const Tensor& x) { return ops::relu(x); }, linear2): each argument is a
  // std::shared_ptr to a module with a unary forward, or a callable (a Lambda step).
  template <typename... Steps>
    requires(sizeof...(Steps) > 0)
  explicit Sequential(Steps&&... steps) {
    (append(std::forward<Steps>(steps)), ...);
  }

  // Appends m as step size() (child name "size()") and returns it.
  template <UnaryForward M>
  std::shared_ptr<M> append(std::shared_ptr<M> m) {
    MT_CHECK(m != nullptr, "Sequential::append", "step {} is null", size());
    M* raw = m.get();  // owned by children_ (and steps_) for as long as the Sequential lives
    add_step(m, [raw](const Tensor& x) -> Tensor { return raw->forward(x); });
    return m;
  }
  // Appends a parameter-free step (an nn::Lambda named `name`) and returns it.
  std::shared_ptr<Lambda> append(UnaryFn fn, std::string name = "lambda");

  std::size_t size() const { return steps_.size(); }
  bool empty() const { return steps_.empty(); }
  // Step i; throws memtrain::Error naming the index and the size when it is out of range.
  std::shared_ptr<Module> at(std::size_t i) const {
    return ::memtrain::detail::container_child_as<Module>("Sequential::at", steps_, i);
  }
  std::shared_ptr<Module> operator[](std::size_t i) const { return at(i); }
  // Step i as a T (nn::Linear, ...); throws when out of range or when the step is another type.
  template <typename T>
  std::shared_ptr<T> get(std::size_t i) const {
    return ::memtrain::detail::container_child_as<T>("Sequential::get", steps_, i);
  }

  // x [anything the first step takes] -> the last step's output.
  Tensor forward(const Tensor& x) override;

  const ckpt::BlockCheckpointer& checkpointing() const { return checkpointer_; }
  // One line per step (index, what it is, and for Lambdas their name), then the checkpointing plan.
  std::string describe() const;

 protected:
  bool apply_checkpointing(const ckpt::Policy& policy) override;

 private:
  void add_step(std::shared_ptr<Module> m, UnaryFn forward);

  std::vector<std::shared_ptr<Module>> steps_;
  std::vector<UnaryFn> forwards_;  // forwards_[i] runs steps_[i]
  ckpt::BlockCheckpointer checkpointer_;
};

// An indexed list of modules (children "0", "1", ...): the blocks of a model whose forward loops over them
// itself. It has no forward, and it does not take checkpointing itself (set_checkpointing walks on into its
// modules, so a ModuleList of Sequentials, or of GPTs, is checkpointed by them).
class ModuleList : public Module {
 public:
  ModuleList() = default;
  template <typename... Ms>
    requires(sizeof...(Ms) > 0)
  explicit ModuleList(std::shared_ptr<Ms>... modules) {
    (append(std::move(modules)), ...);
  }

  // Appends m as module size() and returns it.
  template <typename M>
    requires std::derived_from<M, Module>
  std::shared_ptr<M> append(std::shared_ptr<M> m) {
    add(m);
    return m;
  }

  std::size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  // Module i; throws memtrain::Error naming the index and the size when it is out of range.
  std::shared_ptr<Module> at(std::size_t i) const {
    return ::memtrain::detail::container_child_as<Module>("ModuleList::at", modules_, i);
  }
  std::shared_ptr<Module> operator[](std::size_t i) const { return at(i); }
  // Module i as a T; throws when out of range, or when module i is another type (naming both).
  template <typename T>
  std::shared_ptr<T> get(std::size_t i) const {
    return ::memtrain::detail::container_child_as<T>("ModuleList::get", modules_, i);
  }

  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  void add(std::shared_ptr<Module> m);

  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace memtrain::nn
