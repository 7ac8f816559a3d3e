// Checkpoints: one safetensors file holding the model, the optimizer state and (as metadata) everything
// else a resumed run needs to continue bit for bit: the step, the RNG stream, the loader position.
#include "io/json_limits.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/train/tensor_parallel.h"
#include "memtrain/train/trainer.h"
#include "train/pipeline_stage.h"
#include "train/state_shards.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <regex>

namespace memtrain::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "memtrain-checkpoint";
constexpr const char* kFormatVersion = "1";
constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimPrefix = "optim.";
constexpr const char* kAmpPrefix = "amp.";
constexpr const char* kLossScalerKey = "loss_scaler";
constexpr const char* kFp8Key = "fp8";  // delayed-scaling state, by weight name

// Calls f(number, entry) for each entry of dir whose file name matches `pattern`, number the value of the
// pattern's one group of digits (a name whose number does not fit is passed over). Nothing when dir is empty
// or not a directory.
template <typename F>
void for_each_numbered_file(const std::string& dir, const std::regex& pattern, F f) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern)) continue;
    std::int64_t number = 0;
    const std::string digits = m[1].str();
    if (std::from_chars(digits.data(), digits.data() + digits.size(), number).ec != std::errc()) continue;
    f(number, entry);
  }
}

// (step, path) of every checkpoint file in dir, oldest first.
std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  static const std::regex pattern(R"(ckpt_(\d+)\.safetensors)");
  for_each_numbered_file(dir, pattern, [&](std::int64_t step, const fs::directory_entry& entry) {
    std::error_code ec;
    if (entry.is_regular_file(ec)) out.emplace_back(step, entry.path().string());
  });
  std::sort(out.begin(), out.end());
  return out;
}

std::uint64_t meta_u64(const std::map<std::string, std::string>& meta, const std::string& key,
                       const std::string& path) {
  auto it = meta.find(key);
  MT_CHECK(it != meta.end(), "load_checkpoint", "'{}': metadata has no '{}'", path, key);
  std::uint64_t v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  MT_CHECK(ec == std::errc() && end == s.data() + s.size(), "load_checkpoint",
           "'{}': metadata '{}' should be a non-negative integer, got '{}'", path, key, s);
  return v;
}

std::int64_t meta_i64(const std::map<std::string, std::string>& meta, const std::string& key,
                      const std::string& path) {
  const std::uint64_t v = meta_u64(meta, key, path);
  MT_CHECK(v <= static_cast<std::uint64_t>(INT64_MAX), "load_checkpoint", "'{}': metadata '{}' = {} is too large",
           path, key, v);
  return static_cast<std::int64_t>(v);
}

// The loader position (epoch, batch) names the same samples only under the same batching and seed: say
// so when the checkpoint's run batched differently (a warning: changing them on purpose is allowed).
void warn_on_batching_change(const std::map<std::string, std::string>& meta, const TrainerConfig& now,
                             const std::string& path) {
  auto it = meta.find("config");
  if (it == meta.end()) return;
  nlohmann::json then;
  try {
    then = nlohmann::json::parse(it->second, ::memtrain::detail::json_depth_limit("load_checkpoint", path));
  } catch (const nlohmann::json::exception&) {
    return;
  }
  const nlohmann::json current = now.to_json();
  for (const char* key : {"micro_batch", "seed"}) {
    if (then.contains(key) && then[key] != current[key])
      fmt::print(stderr, "load_checkpoint: warning: '{}' was written with {} {}, this run uses {}: the resumed "
                 "data order differs from the original run's\n", path, key, then[key].dump(), current[key].dump());
  }
  // grad_accum x world_size micro-batches make a step: another split of the same global batch (a run saved at
  // N ranks resumed at M) keeps the data order.
  const auto global = [](const nlohmann::json& c) {
    return c.value("grad_accum", std::int64_t{1}) * c.value("world_size", std::int64_t{1});
  };
  if (then.contains("grad_accum") && global(then) != global(current))
    fmt::print(stderr, "load_checkpoint: warning: '{}' was written with {} micro-batches a step (grad_accum {} x "
               "world_size {}), this run takes {}: the resumed data order differs from the original run's\n", path,
               global(then), then.value("grad_accum", std::int64_t{1}), then.value("world_size", std::int64_t{1}),
               global(current));
  for (const char* key : {"train", "shuffle", "drop_last"}) {
    if (then.contains("data") && then["data"].contains(key) && then["data"][key] != current["data"][key])
      fmt::print(stderr, "load_checkpoint: warning: '{}' was written with data.{} {}, this run uses {}: the "
                 "resumed data order differs from the original run's\n", path, key, then["data"][key].dump(),
                 current["data"][key].dump());
  }
}

}  // namespace

std::string checkpoint_filename(std::int64_t step) { return fmt::format("ckpt_{:08d}.safetensors", step); }

std::string latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  return all.empty() ? std::string() : all.back().second;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, std::int64_t keep) {
  MT_CHECK(keep >= 1, "prune_checkpoints", "keep must be >= 1, got {}", keep);
  auto all = list_checkpoints(dir);
  std::vector<std::string> removed;
  const std::size_t n_remove = all.size() > static_cast<std::size_t>(keep) ? all.size() - keep : 0;
  for (std::size_t i = 0; i < n_remove; ++i) {
    std::error_code ec;
    fs::remove(all[i].second, ec);
    detail::remove_state_shards(all[i].second);  // a ZeRO-1 checkpoint's optimizer state
    MT_CHECK(!ec, "prune_checkpoints", "cannot remove '{}': {}", all[i].second, ec.message());
    removed.push_back(all[i].second);
  }
  return removed;
}

std::vector<std::string> remove_stale_checkpoint_temps(const std::string& dir) {
  std::vector<std::string> removed;
  static const std::regex pattern(R"(ckpt_\d+\.safetensors\.tmp\.(\d+))");
  for_each_numbered_file(dir, pattern, [&](std::int64_t pid, const fs::directory_entry& entry) {
    // A live writer (this process, or another on this machine) may be in the middle of it.
    const bool gone = pid != ::getpid() && (pid > std::numeric_limits<pid_t>::max() ||
                                             (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH));
    std::error_code ec;
    if (gone && fs::remove(entry.path(), ec)) removed.push_back(entry.path().string());
  });
  return removed;
}

std::string Trainer::checkpoint_dir() const {
  if (pipeline_)
    return (fs::path(config_.checkpoint_dir) / fmt::format("stage{}-of-{}", pipeline_->stage, pipeline_->stages))
        .string();
  if (tensor_parallel_)
    return (fs::path(config_.checkpoint_dir) /
            fmt::format("tensor{}-of-{}", tensor_parallel_->rank(), tensor_parallel_->size()))
        .string();
  return config_.checkpoint_dir;
}

bool Trainer::writes_checkpoint() const { return !sync_ || sync_->rank() == 0; }

std::vector<std::int64_t> Trainer::gather_over_parts(std::int64_t mine) const {
  return pipeline_ ? pipeline_->link->gather_i64({mine}) : tensor_parallel_->gather_i64({mine});
}

std::string Trainer::save_checkpoint() {
  MT_CHECK(!config_.checkpoint_dir.empty(), "Trainer::save_checkpoint", "config.checkpoint_dir is empty");
  // Every rank of a data-parallel run holds the same model and state: rank 0 writes them for all; under
  // ZeRO-1 every rank writes its shard of the state too. Every pipeline stage, and every tensor-parallel rank,
  // writes its own part of the model, in its own directory (beside data parallelism: the data rank 0 of each part,
  // the others holding the same part).
  const bool sharded = !whole_params_.empty();
  const bool writes = writes_checkpoint();
  const std::string dir = checkpoint_dir();
  if (!writes && !sharded) return (fs::path(dir) / checkpoint_filename(step_)).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "Trainer::save_checkpoint", "cannot create checkpoint_dir '{}': {}", dir, ec.message());
  const std::string path = (fs::path(dir) / checkpoint_filename(step_)).string();
  save_checkpoint(path);
  // Only after the new file is complete may old ones go; with parts of the model, only once every part's is, so
  // the newest step every part holds is always there to resume from.
  if ((pipeline_ || tensor_parallel_) && writes) (void)gather_over_parts(step_);
  if (writes) {
    prune_checkpoints(dir, config_.keep_checkpoints);
    remove_stale_checkpoint_temps(dir);
  }
  return path;
}

optim::StateDict Trainer::state_by_param_index() const {
  optim::StateDict state = optimizer_->state_view();
  if (whole_params_.empty()) return state;
  optim::StateDict out;
  for (auto& [key, t] : state) {
    const std::size_t dot = key.find('.');
    out.emplace(fmt::format("{}.{}", shards_.at(std::stoull(key.substr(0, dot))).index, key.substr(dot + 1)), t);
  }
  return out;
}

std::unique_ptr<TensorSource> Trainer::checkpoint_state(const std::string& path,
                                                        const std::map<std::string, std::string>& meta,
                                                        const TensorSource& in_file) const {
  const auto shards = meta.find("zero_shards");
  const std::vector<Tensor> params = trained_params();
  std::vector<detail::SavedShard> pieces;
  if (shards != meta.end()) {
    pieces = detail::open_state_shards(path, meta_i64(meta, "zero_shards", path));
  } else {
    // The checkpoint's own entries, which the caller keeps open while the result is read: not owned here.
    detail::SavedShard whole{std::shared_ptr<const TensorSource>(&in_file, [](const TensorSource*) {}), {}};
    for (std::size_t i = 0; i < params.size(); ++i) whole.shards[i] = {0, shape_numel(state_shape(i))};
    pieces.push_back(std::move(whole));
  }
  detail::ShardMap want;
  if (whole_params_.empty()) {
    for (std::size_t i = 0; i < params.size(); ++i) want[i] = {0, shape_numel(state_shape(i))};
  } else {
    for (const Shard& s : shards_) want[s.index] = {s.begin, s.begin + s.count};
  }
  auto state = std::make_unique<detail::ReshardedState>(
      detail::reshard_state(std::move(pieces), want, fmt::format("load_checkpoint: '{}'", path)));
  if (whole_params_.empty()) {
    // Shards are flat; a whole tensor's 32-bit moments have its state's shape (8-bit codes and absmax stay
    // flat, and what every rank keeps whole, a step count or a GaLore basis, is as it was saved).
    for (const std::string& key : state->names()) {
      const std::size_t dot = key.find('.');
      const Shape shape = state_shape(std::stoull(key.substr(0, dot)));
      const std::string_view name = std::string_view(key).substr(dot + 1);
      if (!detail::replicated_state(name) && !name.ends_with(".codes") && !name.ends_with(".absmax") &&
          shape_numel(state->info(key)->shape) == shape_numel(shape))
        state->reshape(key, shape);
    }
    return state;
  }
  // Keys by global parameter index -> by the optimizer's slot.
  std::map<std::size_t, std::size_t> slot_of;  // index in whole_params_ -> the optimizer's slot
  for (std::size_t k = 0; k < shards_.size(); ++k) slot_of[shards_[k].index] = k;
  state->rename([&](const std::string& key) {
    const std::size_t dot = key.find('.');
    return fmt::format("{}.{}", slot_of.at(std::stoull(key.substr(0, dot))), key.substr(dot + 1));
  });
  return state;
}

void Trainer::save_checkpoint(const std::string& path) const {
  mark("checkpoint save");
  // What saving allocates is transient: count it as workspace (the step counts, and the bounded host buffer a
  // device tensor is written through, io::kStagingBytes).
  CategoryGuard category(MemoryCategory::workspace);
  const bool sharded = !whole_params_.empty();
  if (sharded) {
    // ZeRO-1: every rank writes its shards' state; the main file, written last, makes the checkpoint exist.
    detail::StateShard mine{state_by_param_index(), {}};
    for (const Shard& s : shards_) mine.shards[s.index] = {s.begin, s.begin + s.count};
    detail::save_state_shard(path, sync_->rank(), sync_->world_size(), mine);
    sync_->barrier();
    if (!writes_checkpoint()) return;
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : model_->state_dict()) tensors.emplace_back(kModelPrefix + name, t);
  // The state itself, not a copy: written out before anything steps again.
  if (!sharded)
    for (auto& [key, t] : optimizer_->state_view()) tensors.emplace_back(kOptimPrefix + key, t);
  optim::StateDict amp_sd;
  if (scaler_) scaler_->save(amp_sd, kLossScalerKey);
  if (fp8_) fp8_->save(amp_sd, kFp8Key, model_->named_parameters());
  for (auto& [key, t] : amp_sd) tensors.emplace_back(kAmpPrefix + key, t);

  const RngState rng = get_rng_state();
  const data::LoaderPosition pos = train_loader_->position();
  std::map<std::string, std::string> meta = {
      {"format", kFormat},
      {"format_version", kFormatVersion},
      {"step", std::to_string(step_)},
      {"rng_seed", std::to_string(rng.seed)},
      {"rng_offset", std::to_string(rng.offset)},
      {"loader_epoch", std::to_string(pos.epoch)},
      {"loader_batch", std::to_string(pos.batch)},
      {"optimizer", std::string(optimizer_->name())},  // the optimizer stepping, built from the config or by the user
      {"config", config_.to_json().dump()},
  };
  if (sharded) meta["zero_shards"] = std::to_string(sync_->world_size());
  if (pipeline_) meta["pipeline_stage"] = fmt::format("{} of {}", pipeline_->stage, pipeline_->stages);
  if (tensor_parallel_)
    meta["tensor_part"] = fmt::format("{} of {}", tensor_parallel_->rank(), tensor_parallel_->size());
  io::save_safetensors(path, tensors, meta);
}

void Trainer::load_checkpoint(const std::string& path) {
  const char* where = "load_checkpoint";
  const io::SafetensorsFile file(path);  // the header only: tensors are read where they go, below
  const auto& meta = file.metadata();
  auto format = meta.find("format");
  MT_CHECK(format != meta.end() && format->second == kFormat, where, "'{}' is not a memtrain checkpoint (no "
           "metadata format = \"{}\")", path, kFormat);
  auto version = meta.find("format_version");
  MT_CHECK(version != meta.end() && version->second == kFormatVersion, where,
           "'{}' has checkpoint format version '{}'; this build reads version {}", path,
           version == meta.end() ? std::string("none") : version->second, kFormatVersion);
  // Files written before the optimizer's own name was recorded carry the config's kind ("adamw"); they load
  // into a trainer whose config names the same kind.
  const std::string kind(optimizer_->name());
  auto opt_name = meta.find("optimizer");
  const bool legacy_kind = opt_name != meta.end() && opt_name->second == optim::kind_name(config_.optimizer.kind);
  MT_CHECK(opt_name != meta.end() && (opt_name->second == kind || legacy_kind), where,
           "'{}' holds state of optimizer '{}' but this trainer uses '{}'", path,
           opt_name == meta.end() ? std::string("none") : opt_name->second, kind);
  const std::int64_t step = meta_i64(meta, "step", path);
  // A pipeline stage's file holds that stage's part of the model, a tensor-parallel rank's its parts of every
  // block: each resumes the same part of the same layout.
  const auto same_layout = [&](const char* key, const std::string& mine, const char* layout, const char* part,
                               const char* none) {
    const auto written = meta.find(key);
    MT_CHECK((written == meta.end() ? std::string() : written->second) == mine, where,
             "'{}' was written by {} and this trainer is {}: a checkpoint resumes the {} layout it was written with "
             "(resharding between layouts is not built)", path,
             written == meta.end() ? std::string(none) : std::string(part) + " " + written->second,
             mine.empty() ? std::string(none) : std::string(part) + " " + mine, layout);
  };
  same_layout("pipeline_stage",
              pipeline_ ? fmt::format("{} of {}", pipeline_->stage, pipeline_->stages) : std::string(), "pipeline",
              "pipeline stage", "a run without pipeline stages");
  same_layout("tensor_part",
              tensor_parallel_ ? fmt::format("{} of {}", tensor_parallel_->rank(), tensor_parallel_->size())
                               : std::string(),
              "tensor-parallel", "tensor-parallel rank", "a run without tensor parallelism");
  if (step > 0 && parse_grad_compression(config_.grad_compression).enabled())
    fmt::print(stderr, "load_checkpoint: warning: grad_compression '{}': the residuals of the unsent gradient values "
               "and the sparsity warm-up are not in checkpoints; they start again empty, so the resumed run differs "
               "from one that was never stopped\n", config_.grad_compression);
  const RngState rng{meta_u64(meta, "rng_seed", path), meta_u64(meta, "rng_offset", path)};
  const data::LoaderPosition pos{meta_i64(meta, "loader_epoch", path), meta_i64(meta, "loader_batch", path)};

  MT_CHECK(pos.batch < train_loader_->batches_per_epoch(), where,
           "'{}': the loader position (epoch {}, batch {}) does not exist with this run's batching ({} batches of "
           "{} per epoch); were micro_batch or the dataset changed?",
           path, pos.epoch, pos.batch, train_loader_->batches_per_epoch(), config_.micro_batch);

  for (const std::string& name : file.names())
    MT_CHECK(name.starts_with(kModelPrefix) || name.starts_with(kOptimPrefix) || name.starts_with(kAmpPrefix), where,
             "'{}': unexpected tensor '{}' (expected 'model.*', 'optim.*' or 'amp.*')", path, name);
  const PrefixedTensorSource model_sd(file, kModelPrefix), optim_sd(file, kOptimPrefix);
  optim::StateDict amp_sd;  // a few scalars and FP8 histories
  {
    CategoryGuard category(MemoryCategory::workspace);
    amp_sd = read_all(PrefixedTensorSource(file, kAmpPrefix));
  }

  // Check the whole model before changing anything, naming the tensor (Module::load_state_dict would too,
  // but without the file).
  const nn::StateDict current = model_->state_dict();
  for (const auto& [name, t] : current) {
    const auto saved = model_sd.info(name);
    MT_CHECK(saved.has_value(), where, "'{}': missing tensor 'model.{}' (shape {})", path, name,
             shape_str(t.shape()));
    MT_CHECK(saved->shape == t.shape(), where, "'{}': tensor 'model.{}' has shape {} but the model's is {}", path,
             name, shape_str(saved->shape), shape_str(t.shape()));
  }
  for (const std::string& name : model_sd.names()) {
    MT_CHECK(current.count(name) != 0, where, "'{}': tensor 'model.{}' (shape {}) is not in the model", path, name,
             shape_str(model_sd.info(name)->shape));
  }
  try {
    // The amp state and the optimizer first: each checks every key before it replaces its state, and the model
    // is untouched if one throws. A file without scaler or FP8 state (written by a run of another precision)
    // leaves this run's fresh; such state in a file read by a run of another precision has nothing to restore.
    if (scaler_ && amp_sd.count(std::string(kLossScalerKey) + ".scale") != 0) scaler_->load(amp_sd, kLossScalerKey);
    if (fp8_) fp8_->load(amp_sd, kFp8Key, model_->named_parameters());
    // Each tensor is read from the file into the state or parameter it restores (a state saved or loaded in
    // ZeRO shards: each rank's share, from the ranges of the shard files that hold it).
    if (meta.count("zero_shards") == 0 && whole_params_.empty()) optimizer_->load_state_dict(optim_sd);
    else optimizer_->load_state_dict(*checkpoint_state(path, meta, optim_sd));
    try {
      model_->load_state_dict(model_sd, /*strict=*/true);  // checked above: what fails here is a read
    } catch (const Error& e) {
      throw Error(fmt::format("{} (the model is partly loaded: load a checkpoint again before training)", e.what()));
    }
  } catch (const Error& e) {
    throw Error(fmt::format("{}: '{}': {}", where, path, e.what()));
  }

  warn_on_batching_change(meta, config_, path);
  step_ = step;
  set_rng_state(rng);
  train_loader_->seek(pos);
}

bool Trainer::resume_latest() {
  if (pipeline_ || tensor_parallel_) return resume_latest_part();
  const std::string path = latest_checkpoint(config_.checkpoint_dir);
  if (path.empty()) return false;
  load_checkpoint(path);
  return true;
}

bool Trainer::resume_latest_part() {
  // The newest step every part holds (a part may have written a newer one before the run stopped: pruning
  // waits for all parts, so the common one is still there).
  const auto all = list_checkpoints(checkpoint_dir());
  const std::vector<std::int64_t> newest = gather_over_parts(all.empty() ? -1 : all.back().first);
  const std::int64_t step = *std::min_element(newest.begin(), newest.end());
  const std::int64_t most = *std::max_element(newest.begin(), newest.end());
  MT_CHECK(step >= 0 || most < 0, "resume_latest",
           "'{}': some parts of the model (pipeline stages or tensor-parallel ranks) have checkpoints and some none "
           "(newest step by part: {})",
           config_.checkpoint_dir, fmt::join(newest, ", "));
  if (step < 0) return false;
  const auto found = std::find_if(all.begin(), all.end(), [&](const auto& c) { return c.first == step; });
  MT_CHECK(found != all.end(), "resume_latest", "'{}' has no checkpoint of step {}, the newest all parts hold",
           checkpoint_dir(), step);
  load_checkpoint(found->second);
  return true;
}

}  // namespace memtrain::train
