// Spec <-> names and JSON: how a config file or a command line names an optimizer.
#include "core/json_object_reader.h"
#include "memtrain/optim/spec.h"

#include <nlohmann/json.hpp>

namespace memtrain::optim {

using nlohmann::json;

namespace {

OptimizerKind kind_from_name(const std::string& name, const char* where) {
  for (OptimizerKind k : {OptimizerKind::sgd, OptimizerKind::adamw, OptimizerKind::adamw8bit, OptimizerKind::lion,
                          OptimizerKind::lion8bit, OptimizerKind::adafactor}) {
    if (kind_name(k) == name) return k;
  }
  MT_CHECK(false, where, "unknown optimizer '{}' (known: sgd, adamw, adamw8bit, lion, lion8bit, adafactor)", name);
  return OptimizerKind::adamw;
}

Spec family_defaults(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return Spec::sgd();
    case OptimizerKind::adamw: return Spec::adamw();
    case OptimizerKind::adamw8bit: return Spec::adamw8bit();
    case OptimizerKind::lion: return Spec::lion();
    case OptimizerKind::lion8bit: return Spec::lion8bit();
    case OptimizerKind::adafactor: return Spec::adafactor();
  }
  return {};
}

bool is_8bit(OptimizerKind k) {
  return k == OptimizerKind::adamw8bit || k == OptimizerKind::lion8bit;
}

}  // namespace



Spec spec_from_name(const std::string& name, double lr, double weight_decay) {
  switch (kind_from_name(name, "spec_from_name")) {
    case OptimizerKind::sgd: return Spec::sgd({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::adamw: return Spec::adamw({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::adamw8bit: return Spec::adamw8bit({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::lion: return Spec::lion({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::lion8bit: return Spec::lion8bit({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::adafactor: return Spec::adafactor({.lr = lr, .weight_decay = weight_decay});
  }
  return {};
}

// Only the options the family uses are written (SGD's beta1 as "momentum"), so a config file shows what
// matters and from_json can refuse an option the family does not have.
json spec_to_json(const Spec& spec) {
  json j;
  j["kind"] = std::string(kind_name(spec.kind));
  j["lr"] = spec.lr;
  j["weight_decay"] = spec.weight_decay;
  switch (spec.kind) {
    case OptimizerKind::sgd:
      j["momentum"] = spec.beta1;
      j["nesterov"] = spec.nesterov;
      break;
    case OptimizerKind::adamw:
    case OptimizerKind::adamw8bit:
      j["eps"] = spec.eps;
      j["eps_mode"] = adam_eps_mode_name(spec.eps_mode);
      [[fallthrough]];  // and Lion's two betas
    case OptimizerKind::lion:
    case OptimizerKind::lion8bit:
      j["beta1"] = spec.beta1;
      j["beta2"] = spec.beta2;
      break;
    case OptimizerKind::adafactor:
      j["beta1"] = spec.beta1;
      j["decay_rate"] = spec.decay_rate;
      j["eps1"] = spec.eps1;
      j["clip_threshold"] = spec.clip_threshold;
      break;
  }
  if (is_8bit(spec.kind)) {
    j["block_size"] = spec.block_size;
    j["min_8bit_size"] = spec.min_8bit_size;
  }
  return j;
}

Spec spec_from_json(const json& j) {
  const char* where = "spec_from_json";
  MT_CHECK(j.is_object(), where, "an optimizer must be a JSON object, got {}", ::memtrain::detail::type_of(j));
  auto kind_it = j.find("kind");
  MT_CHECK(kind_it != j.end() && kind_it->is_string(), where,
           "'optimizer.kind' (a string: sgd, adamw, adamw8bit, lion, lion8bit, adafactor) is required, got {}",
           kind_it == j.end() ? std::string("none") : kind_it->dump());
  // Start from the family's defaults, then override what the file gives.
  Spec spec = family_defaults(kind_from_name(kind_it->get<std::string>(), where));
  ::memtrain::detail::JsonObjectReader r(j, "optimizer", where);
  r.find("kind");
  r.get("lr", spec.lr);
  r.get("weight_decay", spec.weight_decay);
  switch (spec.kind) {
    case OptimizerKind::sgd:
      r.get("momentum", spec.beta1);
      r.get("nesterov", spec.nesterov);
      break;
    case OptimizerKind::adamw:
    case OptimizerKind::adamw8bit: {
      r.get("eps", spec.eps);
      std::string mode = adam_eps_mode_name(spec.eps_mode);
      r.get("eps_mode", mode);
      spec.eps_mode = adam_eps_mode_from_name(mode);
    }
      [[fallthrough]];  // and Lion's two betas
    case OptimizerKind::lion:
    case OptimizerKind::lion8bit:
      r.get("beta1", spec.beta1);
      r.get("beta2", spec.beta2);
      break;
    case OptimizerKind::adafactor:
      r.get("beta1", spec.beta1);
      r.get("decay_rate", spec.decay_rate);
      r.get("eps1", spec.eps1);
      r.get("clip_threshold", spec.clip_threshold);
      break;
  }
  if (is_8bit(spec.kind)) {
    r.get("block_size", spec.block_size);
    r.get("min_8bit_size", spec.min_8bit_size);
  }
  r.finish();
  return spec;
}

}  // namespace memtrain::optim
