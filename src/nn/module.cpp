// Module registry, traversal, state_dict loading and saving, and the checkpointing walk.
#include "memtrain/nn/module.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "core/backend.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/ops/elementwise.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

namespace memtrain::nn {

namespace {
thread_local Device t_parameter_device = Device::cpu();

bool has_name(const NamedTensors& v, const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return true;
  return false;
}
}  // namespace

Tensor Module::new_parameter(const Shape& shape, DType dtype) {
  CategoryGuard guard(MemoryCategory::parameters);
  return Tensor::empty(shape, dtype, t_parameter_device);
}

ParameterDeviceGuard::ParameterDeviceGuard(Device device) : ScopedThreadValue(t_parameter_device, device) {}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  MT_CHECK(t.defined(), "Module::register_parameter", "parameter '{}' is undefined", name);
  MT_CHECK(is_floating(t.dtype()), "Module::register_parameter", "parameter '{}' needs a floating dtype, got {}",
           name, dtype_name(t.dtype()));
  MT_CHECK(!has_name(params_, name) && !has_name(buffers_, name), "Module::register_parameter",
           "name '{}' is already registered", name);
  t.set_requires_grad(true);
  // A parameter made outside new_parameter (zeros(), randn(), a loaded tensor) is a parameter all the same.
  t.storage()->set_category(MemoryCategory::parameters);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::replace_parameter(const std::string& name, Tensor t) {
  for (auto& [n, p] : params_) {
    if (n != name) continue;
    MT_CHECK(t.defined() && is_floating(t.dtype()) && t.shape() == p.shape(), "Module::replace_parameter",
             "parameter '{}' {} cannot be replaced by {}", name, shape_str(p.shape()),
             t.defined() ? fmt::format("{} {}", shape_str(t.shape()), dtype_name(t.dtype())) : "an undefined tensor");
    t.set_requires_grad(p.requires_grad());
    t.storage()->set_category(MemoryCategory::parameters);
    p = t;
    return t;
  }
  MT_CHECK(false, "Module::replace_parameter", "no parameter '{}' in this module", name);
  return t;
}

Tensor Module::remove_parameter(const std::string& name) {
  for (auto it = params_.begin(); it != params_.end(); ++it) {
    if (it->first != name) continue;
    Tensor t = it->second;
    params_.erase(it);
    return t;
  }
  MT_CHECK(false, "Module::remove_parameter", "no parameter '{}' in this module", name);
  return Tensor();
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  MT_CHECK(t.defined(), "Module::register_buffer", "buffer '{}' is undefined", name);
  MT_CHECK(!has_name(params_, name) && !has_name(buffers_, name), "Module::register_buffer",
           "name '{}' is already registered", name);
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  MT_CHECK(m != nullptr, "Module::register_module", "submodule '{}' is null", name);
  for (const auto& [n, c] : children_)
    MT_CHECK(n != name, "Module::register_module", "submodule '{}' is already registered", name);
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool buffers, NamedTensors& out) const {
  for (const auto& [n, t] : buffers ? buffers_ : params_) out.emplace_back(prefix + n, t);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors all, unique;
  collect("", false, all);
  // A tied weight is registered once; this also guards against a module registered under two names.
  std::set<const TensorImpl*> seen;
  for (auto& nt : all)
    if (seen.insert(nt.second.impl_ptr().get()).second) unique.push_back(std::move(nt));
  return unique;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

Module& Module::to(Device device) {
  try {
    (void)::memtrain::detail::backend_for(device);  // throws saying why the device cannot be used
  } catch (const Error& e) {
    MT_CHECK(false, "Module::to", "cannot move the module to {}: {}", device.str(), e.what());
  }
  // Every tensor once, even when registered under two names or as both (keyed by the shared TensorImpl).
  struct Move {
    Tensor target, moved, grad;
  };
  std::vector<Move> moves;
  std::set<const TensorImpl*> seen;
  auto plan = [&](const NamedTensors& named, bool parameters) {
    for (const auto& [name, t] : named) {
      if (!seen.insert(t.impl_ptr().get()).second || t.device() == device) continue;
      Move m{t, Tensor(), Tensor()};
      {
        CategoryGuard category(parameters ? MemoryCategory::parameters : t.storage()->category());
        m.moved = Tensor::empty(t.shape(), t.dtype(), device);
        m.moved.copy_(t.detach());
      }
      const Tensor g = t.grad();
      if (g.defined() && g.device() != device) {
        CategoryGuard category(MemoryCategory::gradients);
        m.grad = g.detach().to(device);
      }
      moves.push_back(std::move(m));
    }
  };
  plan(named_parameters(), true);
  plan(named_buffers(), false);
  // Nothing below throws: the module switches devices all at once, and the old storage goes with the last
  // handle to it.
  for (Move& m : moves) {
    m.target.set_data_(m.moved);
    if (m.grad.defined()) m.target.set_grad(m.grad);
  }
  return *this;
}

Device Module::device() const {
  std::optional<std::pair<std::string, Device>> first;
  auto check = [&](const NamedTensors& named) {
    for (const auto& [name, t] : named) {
      if (!first) {
        first.emplace(name, t.device());
        continue;
      }
      MT_CHECK(t.device() == first->second, "Module::device", "the module is spread over devices: '{}' is on {} but "
               "'{}' is on {}", first->first, first->second.str(), name, t.device().str());
    }
  };
  check(named_parameters());
  check(named_buffers());
  return first ? first->second : Device::cpu();
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.set_grad(Tensor());
}

StateDict Module::state_dict() const {
  StateDict out;
  for (const auto& [n, t] : named_parameters()) out.emplace(n, t.detach());
  for (const auto& [n, t] : named_buffers()) out.emplace(n, t.detach());
  return out;
}

void Module::load_state_dict(const TensorSource& source, bool strict) {
  StateDict own = state_dict();
  const std::vector<std::string> names = source.names();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [n, t] : own) {
    const auto info = source.info(n);
    if (!info && !std::binary_search(names.begin(), names.end(), n)) {
      missing.push_back(n);
    } else if (!info || info->shape != t.shape()) {
      mismatched.push_back(fmt::format("{} (checkpoint {} vs model {})", n,
                                       info ? shape_str(info->shape) : "undefined", shape_str(t.shape())));
    }
  }
  for (const std::string& n : names)
    if (own.count(n) == 0) unexpected.push_back(n);
  std::string problems;
  auto add = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    problems += fmt::format("{}{}: {}", problems.empty() ? "" : "; ", what, fmt::join(keys, ", "));
  };
  if (strict) add("missing keys", missing);
  if (strict) add("unexpected keys", unexpected);
  add("shape mismatch", mismatched);
  MT_CHECK(problems.empty(), "load_state_dict", "{}", problems);
  for (auto& [n, t] : own)
    if (source.info(n)) source.read_into(n, t);  // t is a detached view: the parameter's storage is kept
}

void Module::save(const std::string& path) const {
  io::save_safetensors(path, state_dict(), {{"format", "pt"}});
}

void Module::load(const std::string& path, bool strict) {
  const io::SafetensorsFile file(path);  // names the file when its header cannot be read
  try {
    load_state_dict(file, strict);
  } catch (const Error& e) {
    MT_CHECK(false, "Module::load", "'{}': {}", path, e.what());
  }
}

void init_normal_(Tensor& t, double std) {
  Tensor r = randn(t.shape(), t.dtype(), t.device());
  t.copy_(r);
  ops::mul_(t, std);
}

bool Module::apply_checkpointing(const ckpt::Policy&) { return false; }

bool Module::offer_checkpointing(const ckpt::Policy& policy, std::set<const Module*>& seen) {
  if (!seen.insert(this).second) return false;
  if (apply_checkpointing(policy)) return true;
  bool taken = false;
  for (const auto& [n, c] : children_) taken = c->offer_checkpointing(policy, seen) || taken;
  return taken;
}

void Module::set_checkpointing(ckpt::Policy policy) {
  std::set<const Module*> seen;
  const bool taken = offer_checkpointing(policy, seen);
  // Nothing took the policy, so nothing changed: refusing here leaves the model as it was.
  MT_CHECK(taken || policy == ckpt::Policy::none(), "Module::set_checkpointing",
           "activation checkpointing '{}': the model declares no checkpointable blocks (use 'none', or put its "
           "blocks in an nn::Sequential, each child one block, or override Module::apply_checkpointing in the "
           "module that runs its blocks through a ckpt::BlockCheckpointer)",
           policy.to_string());
}

}  // namespace memtrain::nn
