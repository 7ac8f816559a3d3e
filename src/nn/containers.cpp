// Sequential, ModuleList and Lambda (include/memtrain/nn/containers.h).
#include "memtrain/nn/containers.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <cstdlib>

namespace memtrain {

namespace {
// "memtrain::nn::Linear" rather than "N8memtrain2nn6LinearE" in messages.
std::string demangled_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  return out;
}
}  // namespace

namespace detail {
void container_index_error(const char* where, std::size_t i, std::size_t size) {
  throw_error(where, fmt::format("index {} is out of range for {} modules", i, size));
}

void container_type_error(const char* where, std::size_t i, const nn::Module& child, const char* wanted) {
  throw_error(where, fmt::format("module {} is a {}, not a {}", i, demangled_name(typeid(child).name()),
                                 demangled_name(wanted)));
}
}  // namespace detail

namespace nn {

Lambda::Lambda(UnaryFn fn, std::string name) : fn_(std::move(fn)), name_(std::move(name)) {
  MT_CHECK(fn_ != nullptr, "nn::Lambda", "'{}' has no function", name_);
}

std::shared_ptr<Lambda> Sequential::append(UnaryFn fn, std::string name) {
  return append(std::make_shared<Lambda>(std::move(fn), std::move(name)));
}

void Sequential::add_step(std::shared_ptr<Module> m, UnaryFn forward) {
  register_module(std::to_string(steps_.size()), m);
  steps_.push_back(std::move(m));
  forwards_.push_back(std::move(forward));
  // A budget plan has one mode per step; with a step more it is made again on the next forward.
  checkpointer_.set_policy(checkpointer_.policy());
}

Tensor Sequential::forward(const Tensor& x) {
  const auto n = static_cast<std::int64_t>(steps_.size());
  Tensor h = x;
  for (std::int64_t i = 0; i < n; ++i) h = checkpointer_.run(i, n, forwards_[static_cast<std::size_t>(i)], h);
  return h;
}

bool Sequential::apply_checkpointing(const ckpt::Policy& policy) {
  checkpointer_.set_policy(policy);
  return true;
}

std::string Sequential::describe() const {
  std::string out;
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const Module& m = *steps_[i];
    const auto* fn = dynamic_cast<const Lambda*>(&m);
    out += fmt::format("({}) {}\n", i, fn != nullptr ? fn->name() : ::memtrain::demangled_name(typeid(m).name()));
  }
  out += checkpointer_.describe(static_cast<std::int64_t>(steps_.size()));
  return out;
}

void ModuleList::add(std::shared_ptr<Module> m) {
  MT_CHECK(m != nullptr, "ModuleList::append", "module {} is null", modules_.size());
  register_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
}

}  // namespace nn
}  // namespace memtrain
