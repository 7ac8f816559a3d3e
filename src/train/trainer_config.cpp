// TrainerConfig <-> JSON, and validate(). Reading is strict: a key the config does not have is an error
// naming it (with its path, "schedule.warmup_step"), and so is a value of the wrong type.
#include "memtrain/train/trainer_config.h"

#include "core/json_object_reader.h"
#include "io/atomic_file.h"
#include "io/json_limits.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/amp/precision.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/optim/galore_projector.h"
#include "memtrain/core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace memtrain::train {

using nlohmann::json;

namespace {

constexpr const char* kWhere = "TrainerConfig";
constexpr std::int64_t kBlock8bit = 256;  // dist::shard_bounds puts ZeRO shard boundaries on it

// A setting stored typed and written by name: the name is read as a string and parsed, and a bad one is
// refused naming the key ("precision: unknown precision 'fp64' ...").
template <typename T, typename Parse>
void read_named(::memtrain::detail::JsonObjectReader& r, const std::string& key, const char* path, T& out,
                Parse parse) {
  std::string name;
  if (r.find(key) == nullptr) return;
  r.get(key, name);
  try {
    out = parse(name);
  } catch (const Error& e) {
    MT_CHECK(false, kWhere, "{}: {}", path, e.what());
  }
}

}  // namespace

const char* lr_decay_name(LrDecay decay) { return decay == LrDecay::constant ? "constant" : "cosine"; }

LrDecay lr_decay_from_name(const std::string& name) {
  if (name == "cosine") return LrDecay::cosine;
  MT_CHECK(name == "constant", "LrSchedule", "unknown schedule.decay '{}' (known: cosine, constant)", name);
  return LrDecay::constant;
}

// ---- TrainerConfig <-> JSON ----------------------------------------------------------------------------

namespace {

// Every setting of TrainerConfig, named once: to_json writes and from_json reads through this one list, so
// a setting cannot be written under one key and read under another. Config is TrainerConfig or its const.
template <typename Config, typename Visitor>
void visit_settings(Config& c, Visitor& v) {
  v.section("model", [&](auto& s) {
    s.field("preset", c.model.preset);
    s.field("seq_len", c.model.seq_len);
    s.field("dropout", c.model.dropout);
    s.field("init_from", c.model.init_from);
  });
  v.section("data", [&](auto& s) {
    s.field("train", c.data.train);
    s.field("val", c.data.val);
    s.field("prefetch", c.data.prefetch);
    s.field("shuffle", c.data.shuffle);
    s.field("drop_last", c.data.drop_last);
  });
  v.custom("optimizer", c.optimizer, optim::spec_to_json, optim::spec_from_json);
  v.section("schedule", [&](auto& s) {
    s.field("warmup_steps", c.schedule.warmup_steps);
    s.field("min_lr_ratio", c.schedule.min_lr_ratio);
    s.named("decay", c.schedule.decay, lr_decay_name, lr_decay_from_name);
  });
  v.field("grad_clip", c.grad_clip);
  v.field("micro_batch", c.micro_batch);
  v.field("grad_accum", c.grad_accum);
  v.field("world_size", c.world_size);
  v.field("zero", c.zero);
  v.field("pipeline_stages", c.pipeline_stages);
  v.field("pipeline_schedule", c.pipeline_schedule);
  v.field("tensor_parallel", c.tensor_parallel);
  v.field("grad_compression", c.grad_compression);
  v.field("offload_optimizer", c.offload_optimizer);
  v.field("canonical_reduction", c.canonical_reduction);
  v.field("head_gradients_in_forward", c.head_gradients_in_forward);
  v.field("head_gemms_in_compute_dtype", c.head_gemms_in_compute_dtype);
  v.named("device", c.device, [](Device d) { return d.str(); },
          [](const std::string& n) { return device_from_name(n, kWhere); });
  v.named("precision", c.precision, amp::precision_name, amp::parse_precision);
  v.named("param_dtype", c.param_dtype, amp::param_dtype_name, amp::parse_param_dtype);
  v.named("weight_casts", c.weight_casts, amp::weight_casts_name, amp::parse_weight_casts);
  v.section("loss_scaler", [&](auto& s) {
    s.field("init_scale", c.loss_scaler.init_scale);
    s.field("growth_factor", c.loss_scaler.growth_factor);
    s.field("backoff_factor", c.loss_scaler.backoff_factor);
    s.field("growth_interval", c.loss_scaler.growth_interval);
    s.field("min_scale", c.loss_scaler.min_scale);
    s.field("max_scale", c.loss_scaler.max_scale);
  });
  v.named("fp8_scaling", c.fp8_scaling, amp::fp8_scaling_name, amp::fp8_scaling_from_name);
  v.field("fp8_amax_history", c.fp8_amax_history);
  v.field("fp8_margin", c.fp8_margin);
  v.named("activation_checkpointing", c.activation_checkpointing,
          [](const ckpt::Policy& p) { return p.to_string(); }, ckpt::Policy::parse);
  v.field("galore_rank", c.galore_rank);
  v.field("galore_update_gap", c.galore_update_gap);
  v.field("galore_scale", c.galore_scale);
  v.named("galore_proj_type", c.galore_proj_type, optim::galore_proj_type_name, optim::galore_proj_type_from_name);
  v.named("galore_svd", c.galore_svd, optim::galore_svd_name, optim::galore_svd_from_name);
  v.named("galore_decay_order", c.galore_decay_order, optim::galore_decay_order_name,
          optim::galore_decay_order_from_name);
  v.field("galore_targets", c.galore_targets);
  v.section("lora", [&](auto& s) {
    s.field("rank", c.lora.rank);
    s.field("alpha", c.lora.alpha);
    s.field("dropout", c.lora.dropout);
    s.field("rslora", c.lora.rslora);
    s.field("quantize_nf4", c.lora.quantize_nf4);
    s.field("targets", c.lora.targets);
  });
  v.field("lisa_layers", c.lisa_layers);
  v.field("lisa_interval", c.lisa_interval);
  v.field("layerwise_update", c.layerwise_update);
  v.field("max_steps", c.max_steps);
  v.field("eval_interval", c.eval_interval);
  v.field("eval_batches", c.eval_batches);
  v.field("log_interval", c.log_interval);
  v.field("checkpoint_interval", c.checkpoint_interval);
  v.field("checkpoint_dir", c.checkpoint_dir);
  v.field("keep_checkpoints", c.keep_checkpoints);
  v.field("max_bad_steps", c.max_bad_steps);
  v.field("seed", c.seed);
  v.field("memory_budget_bytes", c.memory_budget_bytes);
  v.field("metrics_path", c.metrics_path);
  v.field("summary_path", c.summary_path);
}

// Writes each setting under its key (named settings by name; an unset optional as null).
struct JsonWriter {
  json& j;

  template <typename T>
  void field(const char* key, const T& value) {
    j[key] = value;
  }
  void field(const char* key, const std::optional<std::size_t>& value) {
    j[key] = value ? json(*value) : json(nullptr);
  }
  template <typename T, typename Name, typename Parse>
  void named(const char* key, const T& value, Name name, Parse) {
    j[key] = name(value);
  }
  template <typename T, typename Write, typename Read>
  void custom(const char* key, const T& value, Write write, Read) {
    j[key] = write(value);
  }
  template <typename Body>
  void section(const char* key, Body body) {
    JsonWriter inner{j[key]};
    body(inner);
  }
};

// Reads each setting present, strictly: an unknown key, a wrong type or a bad name is an error naming the
// key with its path ("schedule.decay").
struct JsonReader {
  ::memtrain::detail::JsonObjectReader& r;
  std::string path;  // "" or "schedule."

  template <typename T>
  void field(const char* key, T& value) {
    r.get(key, value);
  }
  template <typename T, typename Name, typename Parse>
  void named(const char* key, T& value, Name, Parse parse) {
    read_named(r, key, (path + key).c_str(), value, parse);
  }
  template <typename T, typename Write, typename Read>
  void custom(const char* key, T& value, Write, Read read) {
    const json* v = r.find(key);
    if (v == nullptr) return;
    try {
      value = read(*v);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", kWhere, e.what()));
    }
  }
  template <typename Body>
  void section(const char* key, Body body) {
    const json* v = r.find(key);
    if (v == nullptr) return;
    ::memtrain::detail::JsonObjectReader inner_reader(*v, path + key, kWhere);
    JsonReader inner{inner_reader, path + key + "."};
    body(inner);
    inner_reader.finish();
  }
};

}  // namespace

json TrainerConfig::to_json() const {
  json j;
  JsonWriter writer{j};
  visit_settings(*this, writer);
  return j;
}

TrainerConfig TrainerConfig::from_json(const json& j) {
  TrainerConfig c;
  ::memtrain::detail::JsonObjectReader r(j, "", kWhere);
  JsonReader reader{r, ""};
  visit_settings(c, reader);
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
    j = json::parse(buf.str(), detail::json_depth_limit(where, path));
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
  if (name == "meta") return Device::meta();
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
  MT_CHECK(false, where, "device '{}' is not one of cpu, cuda, cuda:N, meta", name);
  return Device::cpu();
}

// ---- validate ------------------------------------------------------------------------------------------

std::string offload_directory(const std::string& spec) {
  if (spec == "none") return {};
  MT_CHECK(spec != "host", kWhere, "offload_optimizer 'host' keeps a device run's optimizer state in host memory, "
           "which is not built yet (a CPU run's state is in host memory already: use file:DIR to move it out)");
  MT_CHECK(spec.starts_with("file:") && spec.size() > 5, kWhere, "offload_optimizer '{}' is not \"none\" or "
           "\"file:DIR\" (DIR an existing, writable directory)", spec);
  return spec.substr(5);
}

GradCompression parse_grad_compression(const std::string& spec) {
  GradCompression c;
  if (spec == "none") return c;
  const auto fail = [&spec](const std::string& why) {
    MT_CHECK(false, kWhere, "grad_compression '{}': {} (expected \"none\" or \"dgc:RATIO[,momentum=M][,warmup=STEPS]\" "
             "with RATIO in (0, 1), e.g. dgc:0.999)", spec, why);
  };
  // A number that is all of `text` (no trailing characters).
  const auto number = [&fail](const std::string& text, const char* what) {
    std::size_t used = 0;
    double value = 0.0;
    try {
      value = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (text.empty() || used != text.size() || !std::isfinite(value))
      fail(fmt::format("{} '{}' is not a number", what, text));
    return value;
  };
  if (!spec.starts_with("dgc:")) fail("unknown method");
  std::vector<std::string> parts;
  std::stringstream in(spec.substr(4));
  for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
  if (parts.empty()) fail("the ratio is missing");
  c.ratio = number(parts[0], "the ratio");
  if (!(c.ratio > 0.0 && c.ratio < 1.0)) fail(fmt::format("the ratio {} is outside (0, 1)", c.ratio));
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::size_t eq = parts[i].find('=');
    const std::string key = parts[i].substr(0, eq), value = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
    if (key == "momentum") {
      c.momentum = number(value, "momentum");
      if (!(c.momentum >= 0.0 && c.momentum < 1.0)) fail(fmt::format("momentum {} is outside [0, 1)", c.momentum));
    } else if (key == "warmup") {
      const double steps = number(value, "warmup");
      if (!(steps >= 0.0 && steps == std::floor(steps) && steps < 1e12))
        fail(fmt::format("warmup {} is not a whole number of steps >= 0", value));
      c.warmup_steps = static_cast<std::int64_t>(steps);
    } else {
      fail(fmt::format("unknown option '{}' (momentum=M, warmup=STEPS)", parts[i]));
    }
  }
  return c;
}

void TrainerConfig::validate_pipeline() const {
  MT_CHECK(pipeline_stages >= 1, kWhere, "pipeline_stages must be >= 1, got {}", pipeline_stages);
  MT_CHECK(pipeline_schedule == "1f1b" || pipeline_schedule == "gpipe", kWhere,
           "pipeline_schedule '{}' is not one of: 1f1b, gpipe", pipeline_schedule);
  if (pipeline_stages == 1) return;
  const std::int64_t p = pipeline_stages;
  MT_CHECK(grad_accum >= p, kWhere,
           "pipeline_stages {} with grad_accum {}: the pipeline needs at least one micro-batch per stage", p,
           grad_accum);
  MT_CHECK(!device.is_cuda(), kWhere, "pipeline_stages {} on {}: stages exchange activations over MPI on the CPU "
           "only, for now", p, device.str());
  const auto refuse = [&](bool on, std::string_view what) {
    MT_CHECK(!on, kWhere, "pipeline_stages {} with {}: not built yet (pipeline stages run alone, without it)", p,
             what);
  };
  // Beside data parallelism (world_size data ranks of pipeline_stages ranks each), ZeRO-1 at most: ZeRO-2's
  // norm over every rank's gradient shards does not know the stages yet.
  refuse(zero > 1, fmt::format("zero {}", zero));
  refuse(layerwise_update, "layerwise_update");
  refuse(lisa_layers > 0, "lisa_layers");
  refuse(lora.enabled(), "lora");
  refuse(param_dtype != amp::ParamDtype::f32, "param_dtype other than f32");
  refuse(grad_compression != "none", "grad_compression");
}

void TrainerConfig::validate_tensor_parallel() const {
  MT_CHECK(tensor_parallel >= 1, kWhere, "tensor_parallel must be >= 1, got {}", tensor_parallel);
  if (tensor_parallel == 1) return;
  const std::int64_t t = tensor_parallel;
  MT_CHECK(!device.is_cuda(), kWhere, "tensor_parallel {} on {}: the ranks sum their parts over MPI on the CPU "
           "only, for now", t, device.str());
  const auto refuse = [&](bool on, std::string_view what) {
    MT_CHECK(!on, kWhere, "tensor_parallel {} with {}: not built yet", t, what);
  };
  refuse(pipeline_stages > 1, fmt::format("pipeline_stages {}", pipeline_stages));
  // Beside data parallelism (world_size data ranks), ZeRO-1 at most: ZeRO-2 keeps only gradient shards, whose
  // norm does not know the parts yet.
  refuse(zero > 1, fmt::format("zero {}", zero));
  refuse(layerwise_update, "layerwise_update");
  refuse(lisa_layers > 0, "lisa_layers");
  refuse(lora.enabled(), "lora");
  refuse(grad_compression != "none", "grad_compression");
  refuse(precision == amp::Precision::fp8, "precision fp8 (each rank would scale its parts by their own amax)");
  refuse(param_dtype != amp::ParamDtype::f32, "param_dtype other than f32 (the loss would widen wte's part whole)");
  MT_CHECK(optimizer.kind != optim::OptimizerKind::adafactor, kWhere,
           "tensor_parallel {} with optimizer 'adafactor': its row and column statistics would be each rank's part's, "
           "not the whole weight's, so the run would train another model than the run alone", t);
  MT_CHECK(galore_rank == 0, kWhere,
           "tensor_parallel {} with galore_rank {}: GaLore would project each rank's part of a weight by that part's "
           "own subspace, not the whole weight's, so the run would train another model than the run alone", t,
           galore_rank);
}

void TrainerConfig::validate() const {
  MT_CHECK(micro_batch >= 1, kWhere, "micro_batch must be >= 1, got {}", micro_batch);
  MT_CHECK(grad_accum >= 1, kWhere, "grad_accum must be >= 1, got {}", grad_accum);
  MT_CHECK(max_steps >= 1, kWhere, "max_steps must be >= 1, got {}", max_steps);
  MT_CHECK(world_size >= 1, kWhere, "world_size must be >= 1, got {}", world_size);
  MT_CHECK(zero >= 0 && zero <= 2, kWhere, "zero must be 0, 1 or 2 (ZeRO stage), got {}", zero);
  MT_CHECK(zero < 2 || !device.is_cuda(), kWhere,
           "zero {} on {}: ZeRO-2 clips by a norm combined from every rank's gradient shards, which only the CPU's "
           "canonical path computes; use zero 1 on GPUs", zero, device.str());
  MT_CHECK(zero == 0 || (optimizer.block_size > 0 && kBlock8bit % optimizer.block_size == 0), kWhere,
           "zero {} with optimizer.block_size {}: shard boundaries fall every {} elements, so the 8-bit blocks of a "
           "shard are the whole tensor's only for block sizes that divide {}", zero, optimizer.block_size,
           kBlock8bit, kBlock8bit);
  if (zero > 0 && optimizer.kind == optim::OptimizerKind::adafactor) {
    MT_CHECK(galore_rank == 0, kWhere,
             "zero {} with optimizer 'adafactor' under GaLore (galore_rank {}): GaLore shards its projected state "
             "over 256-element blocks, but Adafactor's statistics need whole rows; use zero 0, or adafactor without "
             "GaLore", zero, galore_rank);
    MT_CHECK(!device.is_cuda(), kWhere,
             "zero {} with optimizer 'adafactor' on {}: the row-shard step exchanges its statistics from host memory "
             "(CPU only); use zero 0 on GPUs", zero, device.str());
  }
  validate_pipeline();
  validate_tensor_parallel();
  MT_CHECK(world_size == 1 || std::has_single_bit(static_cast<std::uint64_t>(grad_accum)), kWhere,
           "grad_accum {} with world_size {}: a data-parallel step sums its micro-batch gradients in one canonical "
           "tree over the global batch, and each rank's block must be one subtree of it, so grad_accum must be a "
           "power of two (1, 2, 4, ...)", grad_accum, world_size);
  if (layerwise_update && (canonical_reduction || world_size > 1)) {
    MT_CHECK(galore_rank == 0, kWhere,
             "layerwise_update with GaLore (galore_rank {}) and the canonical reduction (canonical_reduction, or "
             "world_size {}): layer-wise GaLore adds each micro-batch's projected gradient as it comes, outside the "
             "canonical tree", galore_rank, world_size);
    MT_CHECK(world_size == 1 || !device.is_cuda(), kWhere,
             "layerwise_update with world_size {} on {}: the per-parameter norms of the summed gradients are the "
             "CPU's canonical ones; train layer-wise on one GPU, or data parallel without it", world_size, device.str());
    MT_CHECK(world_size == 1 || zero == 0 || optimizer.kind != optim::OptimizerKind::adafactor, kWhere,
             "layerwise_update with optimizer 'adafactor' at zero {}: its row-shard step exchanges statistics for "
             "every parameter at once, so it cannot step one parameter as its sum lands", zero);
  }
  MT_CHECK(!(layerwise_update && precision == amp::Precision::fp16), kWhere,
           "layerwise_update with precision 'fp16' cannot work: the loss scaler must skip the whole step when any "
           "gradient overflows, which is known only after the last one, and layer-wise updates have applied the "
           "others by then (use fp32, or bf16: it needs no loss scaler)");
  if (param_dtype != amp::ParamDtype::f32) {
    const std::string name = amp::param_dtype_name(param_dtype);
    MT_CHECK(precision == amp::Precision::bf16 || precision == amp::Precision::fp8, kWhere,
             "param_dtype {} with precision {}: bf16 weights are the compute copies themselves, so the compute must "
             "run in bf16 (precision bf16 or fp8)", name, amp::precision_name(precision));
    MT_CHECK(world_size == 1 && zero == 0, kWhere, "param_dtype {} with world_size {} / zero {}: data parallel "
             "over bf16 weights is not built yet; train on one rank", name, world_size, zero);
    MT_CHECK(!lora.enabled() && lisa_layers == 0, kWhere, "param_dtype {} with LoRA or LISA: they keep their own "
             "frozen weights in the compute dtype already; leave param_dtype f32", name);
  }
  const amp::Precision p = precision;
  if (p == amp::Precision::fp8) {
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
  MT_CHECK(galore_rank >= 0, kWhere, "galore_rank must be >= 0 (0 = off), got {}", galore_rank);
  if (galore_rank > 0) {
    MT_CHECK(galore_update_gap >= 1, kWhere, "galore_update_gap must be >= 1, got {}", galore_update_gap);
    MT_CHECK(std::isfinite(galore_scale) && galore_scale > 0.0, kWhere, "galore_scale must be > 0, got {}",
             galore_scale);
  }
  for (std::size_t i = 0; i < galore_targets.size(); ++i)
    MT_CHECK(!galore_targets[i].empty(), kWhere, "galore_targets[{}] is empty (a pattern such as \"*.w_in.weight\")",
             i);

  try {
    lora.validate();
  } catch (const Error& e) {
    MT_CHECK(false, kWhere, "lora: {}", e.what());
  }
  MT_CHECK(lisa_layers >= 0, kWhere, "lisa_layers must be >= 0 (0 = off), got {}", lisa_layers);
  MT_CHECK(lisa_interval >= 1, kWhere, "lisa_interval must be >= 1, got {}", lisa_interval);
  if (lisa_layers > 0) {
    MT_CHECK(!lora.enabled(), kWhere, "lisa_layers {} with lora (rank {}): LISA trains whole blocks, LoRA adapters "
             "on frozen ones; choose one", lisa_layers, lora.rank);
    MT_CHECK(galore_rank == 0, kWhere, "lisa_layers {} with GaLore (galore_rank {}): GaLore's projected state cannot "
             "be freed when a block leaves the active set", lisa_layers, galore_rank);
    MT_CHECK(world_size == 1 && !canonical_reduction, kWhere, "lisa_layers {} with world_size {} / "
             "canonical_reduction: LISA is built for one rank and the ordinary reduction", lisa_layers, world_size);
  }
  const GradCompression compression = parse_grad_compression(grad_compression);
  if (compression.enabled()) {
    MT_CHECK(zero == 0, kWhere, "grad_compression '{}' with zero {}: Deep Gradient Compression exchanges whole "
             "sparse gradients, not shards; use zero 0", grad_compression, zero);
    MT_CHECK(!layerwise_update, kWhere, "grad_compression '{}' with layerwise_update: the sparse exchange needs "
             "every gradient of the step at once", grad_compression);
    MT_CHECK(precision != amp::Precision::fp16, kWhere, "grad_compression '{}' with precision fp16: the residuals "
             "kept across steps would mix loss scales; use bf16 or fp32", grad_compression);
    MT_CHECK(device.is_cpu() || device.is_meta(), kWhere, "grad_compression '{}' on {}: the top-k selection and the "
             "sparse exchange run on the CPU (MPI) only", grad_compression, device.str());
  }
  if (!offload_directory(offload_optimizer).empty())
    MT_CHECK(device.is_cpu() || device.is_meta(), kWhere, "offload_optimizer '{}' on {}: file offload keeps a CPU "
             "run's state; a device run's state lives on the device (offloading it is not built yet)",
             offload_optimizer, device.str());
  MT_CHECK(!lora.enabled() || world_size == 1, kWhere,
           "lora (rank {}) with world_size {}: data parallel over adapters is not built yet; train LoRA on one rank",
           lora.rank, world_size);

  MT_CHECK(std::isfinite(grad_clip) && grad_clip >= 0.0, kWhere, "grad_clip must be >= 0 (0 = off), got {}",
           grad_clip);
  MT_CHECK(std::isfinite(optimizer.lr) && optimizer.lr >= 0.0, kWhere, "optimizer.lr must be >= 0, got {}",
           optimizer.lr);
  MT_CHECK(std::isfinite(optimizer.weight_decay) && optimizer.weight_decay >= 0.0, kWhere,
           "optimizer.weight_decay must be >= 0, got {}", optimizer.weight_decay);

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
  MT_CHECK(max_bad_steps >= 0, kWhere, "max_bad_steps must be >= 0 (0 = never stop), got {}", max_bad_steps);

  MT_CHECK(model.seq_len >= 0, kWhere, "model.seq_len must be >= 0 (0 = the preset's block_size), got {}",
           model.seq_len);
  MT_CHECK(model.dropout >= 0.0 && model.dropout < 1.0, kWhere, "model.dropout must be in [0, 1), got {}",
           model.dropout);
  MT_CHECK(data.prefetch >= 0, kWhere, "data.prefetch must be >= 0, got {}", data.prefetch);
}

}  // namespace memtrain::train
