// Spec: an optimizer described as a value (kind + options), so configs and benchmarks can name one and
// build it later: Spec::adamw({.lr = 3e-4, .weight_decay = 0.1}).make(groups).
//
// make(groups): each group keeps its own lr and weight_decay (see decay_groups); the spec's family
// options (betas, eps, momentum, ...) are written into every group. make(params): one group with the
// spec's lr and weight_decay.
#pragma once

#include "memtrain/optim/adamw.h"
#include "memtrain/optim/optimizer.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace memtrain::optim {

enum class OptimizerKind { sgd, adamw, adamw8bit, lion, lion8bit, adafactor };
std::string_view kind_name(OptimizerKind kind);

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;  // L2 on the gradient (PyTorch SGD)
  bool nesterov = false;
};
struct AdamWOptions {
  double lr = 1e-3;
  double weight_decay = 1e-2;  // decoupled
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  AdamEpsMode eps_mode = AdamEpsMode::torch;  // adamw.h: torch.optim's form, or Hugging Face's (hf)
};
struct AdamW8bitOptions {
  double lr = 1e-3;
  double weight_decay = 1e-2;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::int64_t block_size = 256;
  std::int64_t min_8bit_size = 4096;  // smaller tensors keep fp32 state
  AdamEpsMode eps_mode = AdamEpsMode::torch;
};
struct LionOptions {
  double lr = 1e-4;
  double weight_decay = 0.0;  // decoupled
  double beta1 = 0.9;
  double beta2 = 0.99;
};
struct Lion8bitOptions {
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.99;
  std::int64_t block_size = 256;
  std::int64_t min_8bit_size = 4096;
};
struct AdafactorSpecOptions {
  double lr = 1e-2;
  double weight_decay = 0.0;  // decoupled
  double beta1 = 0.0;         // > 0 turns the first moment on
  double decay_rate = -0.8;
  double eps1 = 1e-30;
  double clip_threshold = 1.0;
};

struct Spec {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;  // SGD: momentum
  double beta2 = 0.999;
  double eps = 1e-8;
  AdamEpsMode eps_mode = AdamEpsMode::torch;  // AdamW kinds
  bool nesterov = false;                 // SGD
  std::int64_t block_size = 256;         // 8-bit kinds
  std::int64_t min_8bit_size = 4096;     // 8-bit kinds
  double decay_rate = -0.8;              // Adafactor
  double eps1 = 1e-30;                   // Adafactor
  double clip_threshold = 1.0;           // Adafactor

  static Spec sgd(const SgdOptions& o = {});
  static Spec adamw(const AdamWOptions& o = {});
  static Spec adamw8bit(const AdamW8bitOptions& o = {});
  static Spec lion(const LionOptions& o = {});
  static Spec lion8bit(const Lion8bitOptions& o = {});
  static Spec adafactor(const AdafactorSpecOptions& o = {});

  std::unique_ptr<Optimizer> make(std::vector<ParamGroup> groups) const;
  std::unique_ptr<Optimizer> make(const std::vector<Tensor>& params) const;
  std::string to_string() const;  // "adamw(lr=0.001, wd=0.01, betas=(0.9, 0.999), eps=1e-08)"
};

// Two groups with `lr`: weight_decay for parameters of rank >= 2 (weights), 0 for rank 0/1 (biases, norm
// gains). Empty groups are dropped. Names only document the split (kept for callers' own filters).
std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                                     double weight_decay);

// ---- names and JSON (src/optim/spec_json.cpp) ----
// Only the options the family uses are written (SGD's beta1 as "momentum"); reading starts from the family's
// defaults, and refuses an unknown kind or a key the family does not have, naming it ("optimizer.beta3").
nlohmann::json spec_to_json(const Spec& spec);
Spec spec_from_json(const nlohmann::json& j);
// "adamw", "adamw8bit", "lion", "lion8bit", "sgd", "adafactor" with the given lr and weight decay and the
// family's defaults otherwise; throws listing the known names.
Spec spec_from_name(const std::string& name, double lr, double weight_decay);

}  // namespace memtrain::optim
