// Spec: option aggregates -> one flat value -> the optimizer.
#include "memtrain/optim/spec.h"

#include "memtrain/optim/adafactor.h"
#include "memtrain/optim/adamw.h"
#include "memtrain/optim/factories.h"
#include "memtrain/optim/lion.h"
#include "memtrain/optim/sgd.h"

namespace memtrain::optim {

std::string_view kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::adamw8bit: return "adamw8bit";
    case OptimizerKind::lion: return "lion";
    case OptimizerKind::lion8bit: return "lion8bit";
    case OptimizerKind::adafactor: return "adafactor";
  }
  return "?";
}

namespace {

// The fields every rule sets: its kind, lr, decoupled weight decay and first coefficient (SGD's momentum).
Spec rule(OptimizerKind kind, double lr, double weight_decay, double beta1) {
  Spec s;
  s.kind = kind;
  s.lr = lr;
  s.weight_decay = weight_decay;
  s.beta1 = beta1;
  return s;
}

// The 8-bit variant of a rule: the same spec with its block layout.
Spec blockwise(Spec s, OptimizerKind kind, std::int64_t block_size, std::int64_t min_8bit_size) {
  s.kind = kind;
  s.block_size = block_size;
  s.min_8bit_size = min_8bit_size;
  return s;
}

}  // namespace

Spec Spec::sgd(const SgdOptions& o) {
  Spec s = rule(OptimizerKind::sgd, o.lr, o.weight_decay, o.momentum);
  s.nesterov = o.nesterov;
  return s;
}

Spec Spec::adamw(const AdamWOptions& o) {
  Spec s = rule(OptimizerKind::adamw, o.lr, o.weight_decay, o.beta1);
  s.beta2 = o.beta2;
  s.eps = o.eps;
  s.eps_mode = o.eps_mode;
  return s;
}

Spec Spec::adamw8bit(const AdamW8bitOptions& o) {
  return blockwise(adamw({o.lr, o.weight_decay, o.beta1, o.beta2, o.eps, o.eps_mode}), OptimizerKind::adamw8bit,
                   o.block_size, o.min_8bit_size);
}

Spec Spec::lion(const LionOptions& o) {
  Spec s = rule(OptimizerKind::lion, o.lr, o.weight_decay, o.beta1);
  s.beta2 = o.beta2;
  return s;
}

Spec Spec::lion8bit(const Lion8bitOptions& o) {
  return blockwise(lion({o.lr, o.weight_decay, o.beta1, o.beta2}), OptimizerKind::lion8bit, o.block_size,
                   o.min_8bit_size);
}

Spec Spec::adafactor(const AdafactorSpecOptions& o) {
  Spec s = rule(OptimizerKind::adafactor, o.lr, o.weight_decay, o.beta1);
  s.decay_rate = o.decay_rate;
  s.eps1 = o.eps1;
  s.clip_threshold = o.clip_threshold;
  return s;
}

std::unique_ptr<Optimizer> Spec::make(std::vector<ParamGroup> groups) const {
  for (auto& g : groups) {
    g.beta1 = beta1;
    g.beta2 = beta2;
    g.eps = eps;
  }
  switch (kind) {
    case OptimizerKind::sgd: return std::make_unique<SGD>(std::move(groups), nesterov);
    case OptimizerKind::adamw: return std::make_unique<AdamW>(std::move(groups), eps_mode);
    case OptimizerKind::adamw8bit: return make_adamw8bit(std::move(groups), block_size, min_8bit_size, eps_mode);
    case OptimizerKind::lion: return std::make_unique<Lion>(std::move(groups));
    case OptimizerKind::lion8bit: return make_lion8bit(std::move(groups), block_size, min_8bit_size);
    case OptimizerKind::adafactor: {
      AdafactorOptions o;
      o.decay_rate = decay_rate;
      o.eps1 = eps1;
      o.clip_threshold = clip_threshold;
      o.use_first_moment = beta1 > 0.0;
      return std::make_unique<Adafactor>(std::move(groups), o);
    }
  }
  MT_CHECK(false, "Spec::make", "unknown optimizer kind {}", static_cast<int>(kind));
  return nullptr;
}

std::unique_ptr<Optimizer> Spec::make(const std::vector<Tensor>& params) const {
  ParamGroup g;
  g.params = params;
  g.lr = lr;
  g.weight_decay = weight_decay;
  return make(std::vector<ParamGroup>{std::move(g)});
}

std::string Spec::to_string() const {
  switch (kind) {
    case OptimizerKind::sgd:
      return fmt::format("sgd(lr={}, momentum={}, wd={}, nesterov={})", lr, beta1, weight_decay, nesterov);
    case OptimizerKind::adamw:
    case OptimizerKind::adamw8bit:
      return fmt::format("{}(lr={}, wd={}, betas=({}, {}), eps={}{}{})", kind_name(kind), lr, weight_decay, beta1,
                         beta2, eps, eps_mode == AdamEpsMode::hf ? " (hf form)" : "",
                         kind == OptimizerKind::adamw8bit ? fmt::format(", block={}", block_size) : std::string());
    case OptimizerKind::lion:
    case OptimizerKind::lion8bit:
      return fmt::format("{}(lr={}, wd={}, betas=({}, {}){})", kind_name(kind), lr, weight_decay, beta1, beta2,
                         kind == OptimizerKind::lion8bit ? fmt::format(", block={}", block_size) : std::string());
    case OptimizerKind::adafactor:
      return fmt::format("adafactor(lr={}, wd={}, beta1={}, decay_rate={}, clip={})", lr, weight_decay, beta1,
                         decay_rate, clip_threshold);
  }
  return "?";
}

std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                                     double weight_decay) {
  ParamGroup decay, no_decay;
  decay.lr = no_decay.lr = lr;
  decay.weight_decay = weight_decay;
  no_decay.weight_decay = 0.0;
  for (const auto& [name, t] : named) {
    MT_CHECK(t.defined(), "decay_groups", "parameter '{}' is an undefined tensor", name);
    (t.dim() >= 2 ? decay : no_decay).params.push_back(t);
  }
  std::vector<ParamGroup> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  return out;
}

}  // namespace memtrain::optim
