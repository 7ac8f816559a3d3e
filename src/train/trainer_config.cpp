// TrainerConfig <-> JSON, and validate(). Reading is strict: a key the config does not have is an error
// naming it (with its path, "schedule.warmup_step"), and so is a value of the wrong type.
#include "memtrain/train/trainer_config.h"

#include "io/atomic_file.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/amp/precision.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/optim/galore_projector.h"
#include "memtrain/core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>

namespace memtrain::train {

using nlohmann::json;

namespace {

constexpr const char* kWhere = "TrainerConfig";

std::string type_of(const json& v) { return v.type_name(); }

// Reads the keys of one JSON object into fields, remembering which keys it knows so finish() can name
// the ones it does not. `path` prefixes keys in messages ("model.").
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string path, std::string where)
      : j_(j), path_(std::move(path)), where_(std::move(where)) {
    MT_CHECK(j.is_object(), where_, "'{}' must be a JSON object, got {}", path_.empty() ? "config" : path_,
             type_of(j));
  }

  const json* find(const std::string& key) {
    known_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

  void get(const std::string& key, std::int64_t& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_number_integer(), where_, "'{}' must be an integer, got {} {}", name(key), type_of(*v), v->dump());
      if (v->is_number_unsigned())
        MT_CHECK(v->get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX), where_, "'{}' is too large: {}",
                 name(key), v->dump());
      out = v->get<std::int64_t>();
    }
  }
  void get(const std::string& key, std::uint64_t& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_number_unsigned() || (v->is_number_integer() && v->get<std::int64_t>() >= 0), where_,
               "'{}' must be a non-negative integer, got {}", name(key), v->dump());
      out = v->get<std::uint64_t>();
    }
  }
  void get(const std::string& key, double& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_number(), where_, "'{}' must be a number, got {} {}", name(key), type_of(*v), v->dump());
      out = v->get<double>();
    }
  }
  void get(const std::string& key, bool& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_boolean(), where_, "'{}' must be true or false, got {}", name(key), v->dump());
      out = v->get<bool>();
    }
  }
  void get(const std::string& key, std::string& out) {
    if (const json* v = find(key)) {
      MT_CHECK(v->is_string(), where_, "'{}' must be a string, got {} {}", name(key), type_of(*v), v->dump());
      out = v->get<std::string>();
    }
  }
  // A list of strings; a single string is a list of one.
  void get(const std::string& key, std::vector<std::string>& out) {
    if (const json* v = find(key)) {
      if (v->is_string()) {
        out = {v->get<std::string>()};
        return;
      }
      MT_CHECK(v->is_array(), where_, "'{}' must be a list of strings, got {}", name(key), type_of(*v));
      out.clear();
      for (const json& e : *v) {
        MT_CHECK(e.is_string(), where_, "'{}' must be a list of strings, has {}", name(key), e.dump());
        out.push_back(e.get<std::string>());
      }
    }
  }
  void get(const std::string& key, std::optional<std::size_t>& out) {
    if (const json* v = find(key)) {
      if (v->is_null()) {
        out.reset();
        return;
      }
      MT_CHECK(v->is_number_unsigned() || (v->is_number_integer() && v->get<std::int64_t>() >= 0), where_,
               "'{}' must be null or a non-negative integer (bytes), got {}", name(key), v->dump());
      out = v->get<std::size_t>();
    }
  }

  // Throws on the first key no get()/find() asked for.
  void finish() const {
    for (const auto& [key, value] : j_.items()) {
      MT_CHECK(known_.count(key) != 0, where_, "unknown key '{}' (known: {})", name(key), fmt::join(known_, ", "));
    }
  }

 private:
  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json& j_;
  std::string path_;
  std::string where_;
  std::set<std::string> known_;
};

optim::OptimizerKind kind_from_name(const std::string& name, const char* where) {
  using optim::OptimizerKind;
  for (OptimizerKind k : {OptimizerKind::sgd, OptimizerKind::adamw, OptimizerKind::adamw8bit, OptimizerKind::lion,
                          OptimizerKind::lion8bit, OptimizerKind::adafactor}) {
    if (optim::kind_name(k) == name) return k;
  }
  MT_CHECK(false, where, "unknown optimizer '{}' (known: sgd, adamw, adamw8bit, lion, lion8bit, adafactor)", name);
  return OptimizerKind::adamw;
}

optim::Spec family_defaults(optim::OptimizerKind k) {
  using optim::OptimizerKind;
  switch (k) {
    case OptimizerKind::sgd: return optim::Spec::sgd();
    case OptimizerKind::adamw: return optim::Spec::adamw();
    case OptimizerKind::adamw8bit: return optim::Spec::adamw8bit();
    case OptimizerKind::lion: return optim::Spec::lion();
    case OptimizerKind::lion8bit: return optim::Spec::lion8bit();
    case OptimizerKind::adafactor: return optim::Spec::adafactor();
  }
  return {};
}

bool is_8bit(optim::OptimizerKind k) {
  return k == optim::OptimizerKind::adamw8bit || k == optim::OptimizerKind::lion8bit;
}

}  // namespace

// ---- optimizer spec ------------------------------------------------------------------------------------

optim::Spec spec_from_name(const std::string& name, double lr, double weight_decay) {
  using optim::OptimizerKind;
  switch (kind_from_name(name, "spec_from_name")) {
    case OptimizerKind::sgd: return optim::Spec::sgd({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::adamw: return optim::Spec::adamw({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::adamw8bit: return optim::Spec::adamw8bit({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::lion: return optim::Spec::lion({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::lion8bit: return optim::Spec::lion8bit({.lr = lr, .weight_decay = weight_decay});
    case OptimizerKind::adafactor: return optim::Spec::adafactor({.lr = lr, .weight_decay = weight_decay});
  }
  return {};
}

// Only the options the family uses are written (SGD's beta1 as "momentum"), so a config file shows what
// matters and from_json can refuse an option the family does not have.
json spec_to_json(const optim::Spec& spec) {
  using optim::OptimizerKind;
  json j;
  j["kind"] = std::string(optim::kind_name(spec.kind));
  j["lr"] = spec.lr;
  j["weight_decay"] = spec.weight_decay;
  switch (spec.kind) {
    case OptimizerKind::sgd:
      j["momentum"] = spec.beta1;
      j["nesterov"] = spec.nesterov;
      break;
    case OptimizerKind::adamw:
    case OptimizerKind::adamw8bit:
      j["beta1"] = spec.beta1;
      j["beta2"] = spec.beta2;
      j["eps"] = spec.eps;
      break;
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

optim::Spec spec_from_json(const json& j) {
  using optim::OptimizerKind;
  const char* where = "spec_from_json";
  MT_CHECK(j.is_object(), where, "an optimizer must be a JSON object, got {}", type_of(j));
  auto kind_it = j.find("kind");
  MT_CHECK(kind_it != j.end() && kind_it->is_string(), where,
           "'optimizer.kind' (a string: sgd, adamw, adamw8bit, lion, lion8bit, adafactor) is required, got {}",
           kind_it == j.end() ? std::string("none") : kind_it->dump());
  // Start from the family's defaults, then override what the file gives.
  optim::Spec spec = family_defaults(kind_from_name(kind_it->get<std::string>(), where));
  ObjectReader r(j, "optimizer", where);
  r.find("kind");
  r.get("lr", spec.lr);
  r.get("weight_decay", spec.weight_decay);
  switch (spec.kind) {
    case OptimizerKind::sgd:
      r.get("momentum", spec.beta1);
      r.get("nesterov", spec.nesterov);
      break;
    case OptimizerKind::adamw:
    case OptimizerKind::adamw8bit:
      r.get("beta1", spec.beta1);
      r.get("beta2", spec.beta2);
      r.get("eps", spec.eps);
      break;
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

// ---- TrainerConfig <-> JSON ----------------------------------------------------------------------------

json TrainerConfig::to_json() const {
  json j;
  j["model"] = {{"preset", model.preset}, {"seq_len", model.seq_len}, {"dropout", model.dropout},
                {"init_from", model.init_from}};
  j["data"] = {{"train", data.train},       {"val", data.val},          {"prefetch", data.prefetch},
               {"shuffle", data.shuffle},   {"drop_last", data.drop_last}};
  j["optimizer"] = spec_to_json(optimizer);
  j["schedule"] = {{"warmup_steps", schedule.warmup_steps},
                   {"min_lr_ratio", schedule.min_lr_ratio},
                   {"decay", schedule.decay}};
  j["grad_clip"] = grad_clip;
  j["micro_batch"] = micro_batch;
  j["grad_accum"] = grad_accum;
  j["world_size"] = world_size;
  j["device"] = device;
  j["precision"] = precision;
  j["loss_scaler"] = {{"init_scale", loss_scaler.init_scale},
                      {"growth_factor", loss_scaler.growth_factor},
                      {"backoff_factor", loss_scaler.backoff_factor},
                      {"growth_interval", loss_scaler.growth_interval},
                      {"min_scale", loss_scaler.min_scale},
                      {"max_scale", loss_scaler.max_scale}};
  j["fp8_scaling"] = fp8_scaling;
  j["fp8_amax_history"] = fp8_amax_history;
  j["fp8_margin"] = fp8_margin;
  j["activation_checkpointing"] = activation_checkpointing;
  j["galore_rank"] = galore_rank;
  j["galore_update_gap"] = galore_update_gap;
  j["galore_scale"] = galore_scale;
  j["galore_proj_type"] = galore_proj_type;
  j["galore_svd"] = galore_svd;
  j["layerwise_update"] = layerwise_update;
  j["max_steps"] = max_steps;
  j["eval_interval"] = eval_interval;
  j["eval_batches"] = eval_batches;
  j["log_interval"] = log_interval;
  j["checkpoint_interval"] = checkpoint_interval;
  j["checkpoint_dir"] = checkpoint_dir;
  j["keep_checkpoints"] = keep_checkpoints;
  j["seed"] = seed;
  j["memory_budget_bytes"] = memory_budget_bytes ? json(*memory_budget_bytes) : json(nullptr);
  j["metrics_path"] = metrics_path;
  j["summary_path"] = summary_path;
  return j;
}

TrainerConfig TrainerConfig::from_json(const json& j) {
  TrainerConfig c;
  ObjectReader r(j, "", kWhere);
  if (const json* m = r.find("model")) {
    ObjectReader mr(*m, "model", kWhere);
    mr.get("preset", c.model.preset);
    mr.get("seq_len", c.model.seq_len);
    mr.get("dropout", c.model.dropout);
    mr.get("init_from", c.model.init_from);
    mr.finish();
  }
  if (const json* d = r.find("data")) {
    ObjectReader dr(*d, "data", kWhere);
    dr.get("train", c.data.train);
    dr.get("val", c.data.val);
    dr.get("prefetch", c.data.prefetch);
    dr.get("shuffle", c.data.shuffle);
    dr.get("drop_last", c.data.drop_last);
    dr.finish();
  }
  if (const json* o = r.find("optimizer")) {
    try {
      c.optimizer = spec_from_json(*o);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", kWhere, e.what()));
    }
  }
  if (const json* s = r.find("schedule")) {
    ObjectReader sr(*s, "schedule", kWhere);
    sr.get("warmup_steps", c.schedule.warmup_steps);
    sr.get("min_lr_ratio", c.schedule.min_lr_ratio);
    sr.get("decay", c.schedule.decay);
    sr.finish();
  }
  r.get("grad_clip", c.grad_clip);
  r.get("micro_batch", c.micro_batch);
  r.get("grad_accum", c.grad_accum);
  r.get("world_size", c.world_size);
  r.get("device", c.device);
  r.get("precision", c.precision);
  if (const json* l = r.find("loss_scaler")) {
    ObjectReader lr(*l, "loss_scaler", kWhere);
    lr.get("init_scale", c.loss_scaler.init_scale);
    lr.get("growth_factor", c.loss_scaler.growth_factor);
    lr.get("backoff_factor", c.loss_scaler.backoff_factor);
    lr.get("growth_interval", c.loss_scaler.growth_interval);
    lr.get("min_scale", c.loss_scaler.min_scale);
    lr.get("max_scale", c.loss_scaler.max_scale);
    lr.finish();
  }
  r.get("fp8_scaling", c.fp8_scaling);
  r.get("fp8_amax_history", c.fp8_amax_history);
  r.get("fp8_margin", c.fp8_margin);
  r.get("activation_checkpointing", c.activation_checkpointing);
  r.get("galore_rank", c.galore_rank);
  r.get("galore_update_gap", c.galore_update_gap);
  r.get("galore_scale", c.galore_scale);
  r.get("galore_proj_type", c.galore_proj_type);
  r.get("galore_svd", c.galore_svd);
  r.get("layerwise_update", c.layerwise_update);
  r.get("max_steps", c.max_steps);
  r.get("eval_interval", c.eval_interval);
  r.get("eval_batches", c.eval_batches);
  r.get("log_interval", c.log_interval);
  r.get("checkpoint_interval", c.checkpoint_interval);
  r.get("checkpoint_dir", c.checkpoint_dir);
  r.get("keep_checkpoints", c.keep_checkpoints);
  r.get("seed", c.seed);
  r.get("memory_budget_bytes", c.memory_budget_bytes);
  r.get("metrics_path", c.metrics_path);
  r.get("summary_path", c.summary_path);
  r.finish();
  return c;
}

void TrainerConfig::save(const std::string& path) const {
  const std::string text = to_json().dump(2) + "\n";
  detail::AtomicFileWriter out(path, "TrainerConfig::save");
  out.write(text.data(), text.size());
  out.commit();
}

TrainerConfig TrainerConfig::load(const std::string& path) {
  const char* where = "TrainerConfig::load";
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), where, "cannot open '{}'", path);
  std::stringstream buf;
  buf << in.rdbuf();
  json j;
  try {
    j = json::parse(buf.str());
  } catch (const json::parse_error& e) {
    MT_CHECK(false, where, "'{}' is not valid JSON: {}", path, e.what());
  }
  try {
    return from_json(j);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: '{}': {}", where, path, e.what()));
  }
}

Device device_from_name(const std::string& name, const char* where) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  if (name.rfind("cuda:", 0) == 0 && name.size() > 5 && name.size() <= 8) {
    int index = 0;
    bool digits = true;
    for (std::size_t i = 5; i < name.size(); ++i) {
      digits &= name[i] >= '0' && name[i] <= '9';
      index = index * 10 + (name[i] - '0');
    }
    if (digits) return Device::cuda(index);
  }
  MT_CHECK(false, where, "device '{}' is not one of cpu, cuda, cuda:N", name);
  return Device::cpu();
}

// ---- validate ------------------------------------------------------------------------------------------

void TrainerConfig::validate() const {
  MT_CHECK(micro_batch >= 1, kWhere, "micro_batch must be >= 1, got {}", micro_batch);
  MT_CHECK(grad_accum >= 1, kWhere, "grad_accum must be >= 1, got {}", grad_accum);
  MT_CHECK(max_steps >= 1, kWhere, "max_steps must be >= 1, got {}", max_steps);
  MT_CHECK(world_size == 1, kWhere, "world_size {} is not supported: data-parallel training comes with the "
           "distributed issue (use world_size 1)", world_size);
  device_from_name(device, kWhere);  // only rejects an unknown device name here; the Trainer resolves it
  // Checked before the precision itself: this combination stays impossible once fp16 exists.
  MT_CHECK(!(layerwise_update && precision == "fp16"), kWhere,
           "layerwise_update with precision 'fp16' cannot work: the loss scaler must skip the whole step when any "
           "gradient overflows, which is known only after the last one, and layer-wise updates have applied the "
           "others by then (use fp32, or bf16: it needs no loss scaler)");
  amp::Precision p = amp::Precision::fp32;
  try {
    p = amp::parse_precision(precision);
  } catch (const Error& e) {
    MT_CHECK(false, kWhere, "precision: {}", e.what());
  }
  if (p == amp::Precision::fp8) {
    try {
      (void)amp::fp8_scaling_from_name(fp8_scaling);
    } catch (const Error& e) {
      MT_CHECK(false, kWhere, "fp8_scaling: {}", e.what());
    }
    MT_CHECK(fp8_amax_history >= 1 && fp8_amax_history <= 1 << 20, kWhere,
             "fp8_amax_history must be in [1, 2^20], got {}", fp8_amax_history);
    MT_CHECK(fp8_margin >= 0 && fp8_margin <= 64, kWhere, "fp8_margin must be in [0, 64], got {}", fp8_margin);
  }
  if (p == amp::Precision::fp16) {
    try {
      amp::DynamicLossScaler check(loss_scaler);
    } catch (const Error& e) {
      MT_CHECK(false, kWhere, "loss_scaler: {}", e.what());
    }
  }
  try {
    (void)ckpt::Policy::parse(activation_checkpointing);
  } catch (const Error& e) {
    MT_CHECK(false, kWhere, "activation_checkpointing: {}", e.what());
  }
  MT_CHECK(galore_rank >= 0, kWhere, "galore_rank must be >= 0 (0 = off), got {}", galore_rank);
  if (galore_rank > 0) {
    MT_CHECK(galore_update_gap >= 1, kWhere, "galore_update_gap must be >= 1, got {}", galore_update_gap);
    MT_CHECK(std::isfinite(galore_scale) && galore_scale > 0.0, kWhere, "galore_scale must be > 0, got {}",
             galore_scale);
    try {
      (void)optim::galore_proj_type_from_name(galore_proj_type);
      (void)optim::galore_svd_from_name(galore_svd);
    } catch (const Error& e) {
      MT_CHECK(false, kWhere, "{}", e.what());
    }
  }

  MT_CHECK(std::isfinite(grad_clip) && grad_clip >= 0.0, kWhere, "grad_clip must be >= 0 (0 = off), got {}",
           grad_clip);
  MT_CHECK(std::isfinite(optimizer.lr) && optimizer.lr >= 0.0, kWhere, "optimizer.lr must be >= 0, got {}",
           optimizer.lr);
  MT_CHECK(std::isfinite(optimizer.weight_decay) && optimizer.weight_decay >= 0.0, kWhere,
           "optimizer.weight_decay must be >= 0, got {}", optimizer.weight_decay);

  MT_CHECK(schedule.decay == "cosine" || schedule.decay == "constant", kWhere,
           "unknown schedule.decay '{}' (known: cosine, constant)", schedule.decay);
  MT_CHECK(schedule.warmup_steps >= 0 && schedule.warmup_steps < max_steps, kWhere,
           "schedule.warmup_steps must be in [0, max_steps = {}), got {}", max_steps, schedule.warmup_steps);
  MT_CHECK(schedule.min_lr_ratio >= 0.0 && schedule.min_lr_ratio <= 1.0, kWhere,
           "schedule.min_lr_ratio must be in [0, 1], got {}", schedule.min_lr_ratio);

  MT_CHECK(eval_interval >= 0, kWhere, "eval_interval must be >= 0 (0 = only at the end), got {}", eval_interval);
  MT_CHECK(eval_batches >= 1, kWhere, "eval_batches must be >= 1, got {}", eval_batches);
  MT_CHECK(log_interval >= 1, kWhere, "log_interval must be >= 1, got {}", log_interval);
  MT_CHECK(checkpoint_interval >= 0, kWhere, "checkpoint_interval must be >= 0 (0 = none), got {}",
           checkpoint_interval);
  MT_CHECK(checkpoint_interval == 0 || !checkpoint_dir.empty(), kWhere,
           "checkpoint_interval {} needs checkpoint_dir (where to write them)", checkpoint_interval);
  MT_CHECK(keep_checkpoints >= 1, kWhere, "keep_checkpoints must be >= 1, got {}", keep_checkpoints);

  MT_CHECK(model.seq_len >= 0, kWhere, "model.seq_len must be >= 0 (0 = the preset's block_size), got {}",
           model.seq_len);
  MT_CHECK(model.dropout >= 0.0 && model.dropout < 1.0, kWhere, "model.dropout must be in [0, 1), got {}",
           model.dropout);
  MT_CHECK(data.prefetch >= 0, kWhere, "data.prefetch must be >= 0, got {}", data.prefetch);
}

}  // namespace memtrain::train
