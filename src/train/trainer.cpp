// Trainer: the training loop (accumulation, clipping, schedule, eval) and fit()'s reporting around it.
#include "memtrain/train/trainer.h"

#include "memtrain/amp/autocast.h"
#include "memtrain/amp/precision.h"
#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/nn/lora.h"
#include "core/backend.h"
#include "core/phase_marks.h"
#include "io/atomic_file.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/optim/adafactor.h"
#include "memtrain/optim/galore.h"
#include "memtrain/optim/spec.h"
#include "memtrain/train/tensor_parallel.h"
#include "train/grad_norm.h"
#include "train/gradient_tree.h"
#include "train/layerwise.h"
#include "train/lisa.h"
#include "train/pipeline_stage.h"
#include "train/progress.h"
#include "train/run_summary.h"
#include "train/sync_hooks.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace memtrain::train {

namespace {

// The directory a file path names ("." for a bare file name).
std::string directory_of(const std::string& file) {
  const std::string dir = std::filesystem::path(file).parent_path().string();
  return dir.empty() ? std::string(".") : dir;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr std::int64_t kBlock8bit = 256;  // ZeRO shard boundaries are whole 8-bit blocks

// Adafactor's ZeRO shards are whole rows of a matrix ([..., m, n]: rows of n) and whole 8-bit blocks (the
// gradient norm's unit): boundaries on multiples of lcm(256, n). A vector's rows are its elements.
std::int64_t row_shard_align(const Shape& s) {
  return s.size() >= 2 && s.back() > 0 ? std::lcm(kBlock8bit, s.back()) : kBlock8bit;
}

// Puts the model back in training mode however evaluate() leaves.
struct TrainModeRestorer {
  nn::Module& model;
  ~TrainModeRestorer() { model.train(); }
};

// The configured optimizer over the model's parameters: weights decay, biases and norms do not; with
// galore_rank > 0 the weights galore_targets chooses (default: attention and MLP) step in GaLore's space.
std::unique_ptr<optim::GaLore> make_galore(const TrainerConfig& c, optim::GaLoreGroups groups) {
  optim::GaLoreSpec g;
  g.rank = c.galore_rank;
  g.update_gap = c.galore_update_gap;
  g.scale = c.galore_scale;
  g.proj_type = c.galore_proj_type;
  g.svd = c.galore_svd;
  g.decay_order = c.galore_decay_order;
  return std::make_unique<optim::GaLore>(c.optimizer, g, std::move(groups));
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainerConfig& c, const nn::NamedTensors& named) {
  const optim::Spec& spec = c.optimizer;
  if (c.galore_rank == 0) return spec.make(optim::decay_groups(named, spec.lr, spec.weight_decay));
  optim::GaLoreGroups groups;
  try {
    groups = optim::galore_groups(named, spec.lr, spec.weight_decay, c.galore_targets);
  } catch (const Error& e) {
    MT_CHECK(false, "Trainer", "galore_rank {}: galore_targets: {}", c.galore_rank, e.what());
  }
  MT_CHECK(!groups.projected.empty(), "Trainer",
           "galore_rank {}: the model has no attention or MLP weights to project (the default targets: 2-D "
           "'.weight' parameters below a module named attn, self_attn or mlp); choose them with galore_targets "
           "(e.g. \"*.w_in.weight\"). The 2-D parameters are: {}",
           c.galore_rank, optim::describe_matrices(named));
  return make_galore(c, std::move(groups));
}

// The dtype LoRA keeps its frozen weights in: the one autocast computes in, or f32 without autocast.
DType frozen_dtype(amp::Precision precision) {
  return precision == amp::Precision::fp32 ? DType::f32 : amp::activation_dtype(precision);
}

// A user-built optimizer must step the model's own parameters, and every one that requires grad: a gradient
// no optimizer holds would never be applied, nor freed by zero_grad.
void check_user_optimizer(const TrainerConfig& c, const optim::Optimizer& optimizer, const nn::NamedTensors& named) {
  const char* where = "Trainer";
  MT_CHECK(c.galore_rank == 0, where,
           "galore_rank {} with an optimizer given: the config asks for GaLore but the optimizer was built by the "
           "caller; set galore_rank 0, or build an optim::GaLore yourself and pass it",
           c.galore_rank);
  std::unordered_set<const TensorImpl*> model_params;
  for (const auto& [name, p] : named) model_params.insert(p.impl_ptr().get());
  std::unordered_set<const TensorImpl*> held;
  std::size_t index = 0;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    for (const Tensor& p : optimizer.param_groups()[g].params) {
      MT_CHECK(p.defined() && model_params.count(p.impl_ptr().get()) != 0, where,
               "the optimizer's parameter {} (group {}, shape {}) is not a parameter of the model: build the "
               "optimizer over model->parameters()",
               index, g, p.defined() ? shape_str(p.shape()) : std::string("undefined"));
      held.insert(p.impl_ptr().get());
      ++index;
    }
  }
  MT_CHECK(index > 0, where, "the optimizer holds no parameters");
  for (const auto& [name, p] : named)
    MT_CHECK(!p.requires_grad() || held.count(p.impl_ptr().get()) != 0, where,
             "parameter '{}' (shape {}) requires grad but the optimizer does not hold it: its gradient would never "
             "be applied or freed (freeze it with requires_grad false, or add it to a group)",
             name, shape_str(p.shape()));
}

// The batch with its tensors on `device` (the model's), copied there under MemoryCategory::data.
data::Batch on_device(data::Batch batch, Device device) {
  CategoryGuard category(MemoryCategory::data);
  if (batch.inputs.defined() && batch.inputs.device() != device) batch.inputs = batch.inputs.to(device);
  if (batch.targets.defined() && batch.targets.device() != device) batch.targets = batch.targets.to(device);
  return batch;
}

}  // namespace

std::vector<std::string> detail::trained_order(const TrainerConfig& config, const nn::NamedTensors& whole) {
  std::map<const TensorImpl*, std::string> names;
  for (const auto& [name, t] : whole) names[t.impl_ptr().get()] = name;
  nn::NamedTensors trained;
  std::copy_if(whole.begin(), whole.end(), std::back_inserter(trained),
               [](const auto& e) { return e.second.requires_grad(); });
  std::vector<std::string> order;
  const std::unique_ptr<optim::Optimizer> optimizer = make_optimizer(config, trained);
  for (const auto& g : optimizer->param_groups())
    for (const Tensor& p : g.params) order.push_back(names.at(p.impl_ptr().get()));
  return order;
}

Trainer::Trainer(TrainerConfig config, std::shared_ptr<nn::Module> model, LossFn loss_fn,
                 std::shared_ptr<const data::Dataset> train, std::shared_ptr<const data::Dataset> val)
    : config_(std::move(config)), model_(std::move(model)), loss_fn_(std::move(loss_fn)), val_(std::move(val)) {
  setup(std::move(train));
}

Trainer::Trainer(TrainerConfig config, std::shared_ptr<nn::Module> model, std::unique_ptr<optim::Optimizer> optimizer,
                 LossFn loss_fn, std::shared_ptr<const data::Dataset> train, std::shared_ptr<const data::Dataset> val)
    : config_(std::move(config)), model_(std::move(model)), loss_fn_(std::move(loss_fn)), val_(std::move(val)),
      optimizer_(std::move(optimizer)) {
  MT_CHECK(optimizer_ != nullptr, "Trainer", "the optimizer is null (use the constructor without one to build it "
           "from config.optimizer)");
  user_optimizer_ = true;
  setup(std::move(train));
}

void Trainer::setup(std::shared_ptr<const data::Dataset> train) {
  config_.validate();
  MT_CHECK(model_ != nullptr, "Trainer", "model is null");
  MT_CHECK(static_cast<bool>(loss_fn_), "Trainer", "loss_fn is empty");
  MT_CHECK(train != nullptr, "Trainer", "the training dataset is null");
  const Device device = config_.device;
  try {
    (void)::memtrain::detail::backend_for(device);  // throws saying why the device cannot be used
  } catch (const Error& e) {
    MT_CHECK(false, "Trainer", "config.device '{}': CUDA is not usable here ({})", device.str(), e.what());
  }
  if (config_.lora.enabled()) {
    MT_CHECK(nn::lora_layers(*model_).empty(), "Trainer",
             "config.lora.rank {} but the model has LoRA adapters already: set lora.rank 0 to train the model's "
             "own adapters, or give the Trainer a model without them", config_.lora.rank);
    nn::apply_lora(*model_, config_.lora, frozen_dtype(config_.precision));
  }
  // In place, before the optimizer is built: every handle to a parameter sees the moved data.
  model_->to(device);
  // The config is authoritative: a model without checkpointable blocks refuses any policy but none.
  model_->set_checkpointing(config_.activation_checkpointing);
  const nn::NamedTensors all = model_->named_parameters();
  nn::NamedTensors named;  // what trains: frozen parameters (LoRA's base) get no optimizer state
  std::copy_if(all.begin(), all.end(), std::back_inserter(named), [](const auto& e) { return e.second.requires_grad(); });
  MT_CHECK(!named.empty(), "Trainer", "the model has no parameters to train{}",
           all.empty() ? "" : " (every one is frozen: requires_grad false)");
  device_ = device;
  store_params_narrow(named);

  if (optimizer_) {
    check_user_optimizer(config_, *optimizer_, all);
  } else {
    optimizer_ = make_optimizer(config_, named);
  }
  if (config_.param_dtype != amp::ParamDtype::f32)
    optimizer_->set_narrow_params({.seed = config_.seed, .kahan = config_.param_dtype == amp::ParamDtype::bf16_kahan});
  for (const auto& g : optimizer_->param_groups()) base_lrs_.push_back(g.lr);
  set_up_offload();
  if (config_.layerwise_update) layerwise_ = detail::LayerwiseUpdater::install(*optimizer_, config_.grad_clip);
  if (config_.lisa_layers > 0)
    lisa_ = std::make_unique<detail::Lisa>(*model_, config_.lisa_layers, config_.lisa_interval, config_.seed,
                                           frozen_dtype(config_.precision));
  const amp::Precision precision = config_.precision;
  compute_dtype_ = amp::activation_dtype(precision);
  if (precision == amp::Precision::fp16) scaler_ = std::make_unique<amp::DynamicLossScaler>(config_.loss_scaler);
  if (precision == amp::Precision::fp8) {
    amp::Fp8Recipe recipe;
    recipe.kind = config_.fp8_scaling;
    recipe.delayed.history_len = static_cast<int>(config_.fp8_amax_history);
    recipe.delayed.margin = static_cast<int>(config_.fp8_margin);
    fp8_ = std::make_unique<amp::Fp8State>(recipe);
  }

  train_ = std::move(train);
  make_train_loader(0, 1);
  if (val_) {
    // Evaluation sees the val set in order and every sample of it, so runs compare on the same numbers.
    data::LoaderOptions options = train_loader_->options();
    options.shuffle = false;
    options.drop_last = false;
    options.batch_block = 0;
    val_loader_ = std::make_unique<data::Loader>(val_, options);
  }

  Allocator& allocator = Allocator::get(device_);
  if (config_.memory_budget_bytes) {
    previous_budget_ = allocator.budget();
    allocator.set_budget(config_.memory_budget_bytes);
    budget_set_ = true;
  }
  allocator.reset_peak();
  model_->train();
}

// config.param_dtype bf16: every trained f32 parameter is stored in bf16 from here on, in place (each handle to
// it, the model's and the optimizer's, sees the new storage), and the f32 storage goes.
void Trainer::store_params_narrow(const nn::NamedTensors& trained) {
  const DType storage = amp::param_storage_dtype(config_.param_dtype);
  if (storage == DType::f32) return;
  CategoryGuard category(MemoryCategory::parameters);
  autograd::NoGradGuard no_grad;
  for (const auto& [name, p] : trained) {
    Tensor param = p;
    if (param.dtype() == DType::f32) param.set_data_and_dtype_(param.detach().to(storage));
  }
  // The f32 blocks are cached now, in sizes the bf16 run never asks for again: hand them back, so that they
  // leave the reserved bytes (and, mapped from the OS, the process) before the run starts.
  Allocator::get(device_).empty_cache();
}

void Trainer::make_train_loader(std::int64_t rank, std::int64_t world_size) {
  data::LoaderOptions options;
  options.batch_size = config_.micro_batch;
  options.seed = config_.seed;
  options.shuffle = config_.data.shuffle;
  options.drop_last = config_.data.drop_last;
  options.prefetch = config_.data.prefetch;
  options.rank = rank;
  options.world_size = world_size;
  // Whole blocks of micro-batches per rank, so global micro-batch i holds the same samples at any world size.
  if (world_size > 1) options.batch_block = config_.grad_accum;
  train_loader_.reset();  // its worker stops before the new one starts
  train_loader_ = std::make_unique<data::Loader>(train_, options);
}

void Trainer::set_gradient_sync(std::shared_ptr<GradientSync> sync) {
  const char* where = "Trainer::set_gradient_sync";
  MT_CHECK(sync != nullptr, where, "the gradient sync is null");
  MT_CHECK(step_ == 0 && history_.empty(), where,
           "the trainer has already stepped ({} steps): attach data parallelism before training or resuming", step_);
  MT_CHECK(sync->world_size() == config_.world_size, where,
           "config.world_size is {} but the group has {} ranks (launch with mpirun -np {}, or set world_size {})",
           config_.world_size, sync->world_size(), config_.world_size, sync->world_size());
  MT_CHECK(sync_ == nullptr, where, "data parallelism is already attached to this trainer");
  sync->check_same_config(config_.to_json());
  sync_ = std::move(sync);
  make_train_loader(sync_->rank(), sync_->world_size());
  sync_hooks_ = detail::SyncHooks::install(trained_params());
  if (config_.zero >= 1) shard_optimizer();
  sync_->expect_order(backward_order());
  if (config_.layerwise_update) {
    // Each parameter (or its shard) is stepped as its sum over the ranks lands; the hooks of the updater made
    // for training alone go quiet with it.
    landed_params_ = trained_params();  // fixed from here on: looked up for every parameter of every step
    layerwise_ = detail::LayerwiseUpdater::for_ranks(*optimizer_, config_.grad_clip, landed_params_);
    sync_->set_landed([this](std::size_t k, double norm) { step_landed(k, norm); });
  }
}

const Trainer::Shard* Trainer::shard_of(std::size_t index) const {
  MT_CHECK(index < shard_at_.size(), "Trainer (ZeRO)", "parameter {} of {}", index, shard_at_.size());
  return shard_at_[index] < 0 ? nullptr : &shards_[static_cast<std::size_t>(shard_at_[index])];
}

void Trainer::step_landed(std::size_t index, double norm) {
  Tensor whole = landed_params_.at(index);
  Tensor target = whole;  // what this rank steps: the parameter, its shard, or nothing (an empty shard)
  if (!whole_params_.empty()) {
    const Shard* s = shard_of(index);
    target = s == nullptr ? Tensor() : s->view;
    if (target.defined()) set_shard_gradient(*s);
  }
  layerwise_->step_summed(index, target, norm);
  whole.set_grad(Tensor());
}

bool Trainer::canonical_reduction_on() const {
  return config_.canonical_reduction || config_.world_size > 1 || sync_ != nullptr || config_.pipeline_stages > 1;
}

bool Trainer::writes_files() const {
  return (!sync_ || sync_->rank() == 0) && (!pipeline_ || pipeline_->first()) &&
         (!tensor_parallel_ || tensor_parallel_->rank() == 0);
}

double Trainer::clip_gradients(const std::vector<Tensor>& params) {
  const double clip = config_.grad_clip;
  std::vector<Tensor> grads;  // what the clip scales: the shards' gradients, or the whole ones
  const double norm = tensor_parallel_ ? tensor_parallel_norm(params, grads) : canonical_norm(params, grads);
  if (clip > 0.0 && std::isfinite(norm) && norm > clip) {
    autograd::NoGradGuard no_grad;
    CategoryGuard category(MemoryCategory::workspace);
    for (Tensor& g : grads)
      if (g.defined()) ops::mul_(g, clip / (norm + 1e-6));  // the factor clip_grad_norm applies
  }
  return norm;
}

double Trainer::canonical_norm(const std::vector<Tensor>& params, std::vector<Tensor>& grads) const {
  // The canonical order: each backend sums its gradients' 256-element blocks (CUDA on the device, reading back
  // one double per block), the host adds the blocks in order. A prediction (meta) allocates what the CPU does.
  if (!canonical_reduction_on()) {
    for (const Tensor& p : params) grads.push_back(p.grad());
    return global_grad_norm(params);
  }
  // A norm in one order whatever the split over ranks, so a sharded run clips with the run alone's bits.
  const bool sharded = config_.zero >= 2 && !whole_params_.empty();
  // A pipeline stage fills in its own parameters' blocks of the whole model's list, in one rank's order.
  std::vector<std::int64_t> numels;
  if (pipeline_) {
    numels = pipeline_->global_numels;
  } else {
    for (const Tensor& p : params) numels.push_back(p.numel());
  }
  std::vector<detail::GradPiece> pieces;
  if (sharded) {
    for (const Shard& s : shards_) {
      grads.push_back(s.view.grad());
      const Tensor& g = grads.back();
      if (!s.projected) {
        pieces.push_back({s.index, s.begin, g.defined() ? g.to(DType::f32) : Tensor()});
      } else if (sync_->rank() == 0) {  // whole and alike on every rank: its blocks come from rank 0 alone
        pieces.push_back({s.index, 0, g.defined() ? g.to(DType::f32).contiguous().view({g.numel()}) : Tensor()});
      }
    }
  } else {
    for (std::size_t i = 0; i < params.size(); ++i) {
      grads.push_back(params[i].grad());
      const Tensor& g = grads.back();
      pieces.push_back({pipeline_ ? pipeline_->global_index[i] : i, 0,
                        g.defined() ? g.to(DType::f32).contiguous().view({g.numel()}) : Tensor()});
    }
  }
  std::function<void(std::vector<double>&)> combine;
  if (sharded) combine = [this](std::vector<double>& blocks) { sync_->combine_disjoint(blocks); };
  if (pipeline_) combine = [this](std::vector<double>& blocks) { detail::combine_stage_blocks(*pipeline_, blocks); };
  return detail::canonical_grad_norm(numels, pieces, combine);
}

std::vector<std::size_t> Trainer::backward_order() const {
  // The backward meets the parameters roughly in reverse of the model's registration order; the trained list
  // is in optimizer-group order (matrices, then biases and norms), which is not.
  const std::vector<Tensor> trained = trained_params();
  std::unordered_map<const TensorImpl*, std::size_t> index;
  for (std::size_t k = 0; k < trained.size(); ++k) index.emplace(trained[k].impl_ptr().get(), k);
  std::vector<std::size_t> order;
  std::vector<bool> placed(trained.size(), false);
  const std::vector<Tensor> in_model = model_->parameters();
  for (auto it = in_model.rbegin(); it != in_model.rend(); ++it) {
    const auto found = index.find(it->impl_ptr().get());
    if (found == index.end() || placed[found->second]) continue;
    placed[found->second] = true;
    order.push_back(found->second);
  }
  for (std::size_t k = trained.size(); k-- > 0;)
    if (!placed[k]) order.push_back(k);  // not the model's own (e.g. a caller's extra tensor): last
  return order;
}

std::vector<Tensor> Trainer::trained_params() const {
  if (!whole_params_.empty()) return whole_params_;
  std::vector<Tensor> params;
  for (const auto& g : optimizer_->param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
  return params;
}

void Trainer::shard_optimizer() {
  const char* where = "Trainer (ZeRO)";
  MT_CHECK(!user_optimizer_, where, "ZeRO-1 shards the optimizer the config describes; an optimizer built by the "
           "caller cannot be rebuilt over shards (pass it with zero 0, or describe it in config.optimizer)");
  const auto* galore = dynamic_cast<const optim::GaLore*>(optimizer_.get());
  const bool by_rows = config_.optimizer.kind == optim::OptimizerKind::adafactor;
  const auto range_of = [this](std::int64_t numel, std::int64_t align) {
    const std::vector<std::int64_t> bounds = sync_->shard_bounds(numel, align);
    return std::pair<std::int64_t, std::int64_t>(bounds[sync_->rank()], bounds[sync_->rank() + 1]);
  };
  // The groups were built over whole tensors, so weight decay (by rank) is each whole tensor's choice; so is
  // 8-bit state, through whole_shape.
  std::vector<optim::ParamGroup> groups = optimizer_->param_groups();
  optim::GaLoreGroups split;  // the same groups, for GaLore
  for (optim::ParamGroup& g : groups) {
    const bool projected = galore != nullptr && !g.params.empty() && galore->is_projected(g.params.front());
    std::vector<Tensor> whole = std::move(g.params);
    g.params.clear();
    g.whole_shape.clear();
    for (const Tensor& p : whole) {
      whole_params_.push_back(p);
      if (projected) {  // held whole; GaLore shards its state over R's elements
        const auto [begin, end] = range_of(shape_numel(galore->projected_shape(p)), kBlock8bit);
        g.params.push_back(p);
        shards_.push_back({p, p, begin, end - begin, whole_params_.size() - 1, true, kBlock8bit});
        continue;
      }
      const std::int64_t align = by_rows ? row_shard_align(p.shape()) : kBlock8bit;
      exchanged_params_.push_back(p);
      exchanged_aligns_.push_back(align);
      const auto [begin, end] = range_of(p.numel(), align);
      if (begin == end && !by_rows) continue;  // a small tensor: lower ranks hold it
      Tensor view = p.detach().view({p.numel()}).narrow(0, begin, end - begin);
      g.params.push_back(view);
      g.whole_shape.push_back(p.shape());
      shards_.push_back({p, view, begin, end - begin, whole_params_.size() - 1, false, align});
    }
    if (galore != nullptr) (projected ? split.projected : split.plain).push_back(g);
  }
  shard_at_.assign(whole_params_.size(), -1);
  for (std::size_t k = shards_.size(); k-- > 0;) shard_at_[shards_[k].index] = static_cast<std::ptrdiff_t>(k);
  // The whole tensors' optimizer goes before the shards' is made.
  optimizer_.reset();
  if (galore != nullptr) {
    std::unique_ptr<optim::GaLore> sharded = make_galore(config_, std::move(split));
    sharded->shard_projected_state({[range_of](std::int64_t numel) { return range_of(numel, kBlock8bit); },
                                    [this](Tensor& flat) { sync_->gather_shards({flat}, {kBlock8bit}); }});
    optimizer_ = std::move(sharded);
  } else {
    optimizer_ = config_.optimizer.make(std::move(groups));
  }
  if (offload_) optimizer_->set_state_arena(offload_);
  if (galore == nullptr && by_rows) shard_adafactor_rows();
}

void Trainer::shard_adafactor_rows() {
  auto* adafactor = dynamic_cast<optim::Adafactor*>(optimizer_.get());
  MT_CHECK(adafactor != nullptr, "Trainer (ZeRO)", "optimizer 'adafactor' made a {}", optimizer_->name());
  optim::Adafactor::RowShards rows;
  rows.rank = static_cast<int>(sync_->rank());
  rows.row_bounds = [this](const Shape& whole) {
    std::vector<std::int64_t> bounds = sync_->shard_bounds(shape_numel(whole), row_shard_align(whole));
    const std::int64_t cols = whole.size() >= 2 ? whole.back() : 1;
    for (std::int64_t& b : bounds) b = cols == 0 ? 0 : b / cols;
    return bounds;
  };
  rows.gather = [this](const std::vector<double>& mine) {
    // Counts first, then every rank's values padded to the longest.
    const std::vector<std::int64_t> counts = sync_->gather_i64({static_cast<std::int64_t>(mine.size())});
    const std::int64_t longest = *std::max_element(counts.begin(), counts.end());
    std::vector<double> padded = mine;
    padded.resize(static_cast<std::size_t>(longest), 0.0);
    const std::vector<double> all = sync_->gather_f64(padded);
    std::vector<std::vector<double>> out;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      const auto from = all.begin() + static_cast<std::ptrdiff_t>(q * static_cast<std::size_t>(longest));
      out.emplace_back(from, from + counts[q]);
    }
    return out;
  };
  adafactor->shard_rows(std::move(rows));
}

std::vector<std::int64_t> Trainer::gradient_shards() const {
  if (config_.zero < 2 || whole_params_.empty()) return {};
  std::vector<std::int64_t> align(whole_params_.size(), kBlock8bit);
  for (const Shard& s : shards_) align[s.index] = s.projected ? 0 : s.align;
  return align;
}

void Trainer::set_shard_gradients() {
  for (Shard& s : shards_) {
    if (!s.projected) set_shard_gradient(s);  // a projected one is stepped whole, from its whole gradient
  }
}

void Trainer::set_shard_gradient(const Shard& s) {
  const Tensor g = config_.zero >= 2 ? sync_->take_shard_gradient(s.index) : s.whole.grad();
  Tensor(s.view).set_grad(!g.defined() || config_.zero >= 2
                              ? g
                              : g.contiguous().view({s.whole.numel()}).narrow(0, s.begin, s.count));
}

Shape Trainer::state_shape(std::size_t i) const {
  const Tensor p = trained_params().at(i);
  const auto* galore = dynamic_cast<const optim::GaLore*>(optimizer_.get());
  if (galore == nullptr) return p.shape();
  // Sharded, the optimizer holds a plain weight's shard, not the weight: ask it only about what it holds whole.
  const Shard* shard = whole_params_.empty() ? nullptr : shard_of(i);
  const bool projected = whole_params_.empty() ? galore->is_projected(p) : shard != nullptr && shard->projected;
  return projected ? galore->projected_shape(p) : p.shape();
}

Trainer::~Trainer() {
  if (timeline_ != nullptr) ::memtrain::detail::set_phase_listener(nullptr);
  if (budget_set_) Allocator::get(device_).set_budget(previous_budget_);
}

StepMetrics Trainer::train_step() {
  const char* where = "Trainer::train_step";
  const auto t0 = Clock::now();
  model_->train();
  release_free_heap();  // the last step's GEMM buffers: see trainer.h

  // The schedule scales each group's own lr, so groups set up with different lrs keep their ratio.
  const double scale = config_.schedule.lr_at(step_, 1.0, config_.max_steps);
  auto& groups = optimizer_->param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].lr = base_lrs_[i] * scale;
  if (lisa_) lisa_->before_step(step_, *optimizer_);
  const std::vector<Tensor> params = trained_params();
  optimizer_->zero_grad();
  if (!whole_params_.empty()) autograd::zero_grad(whole_params_);

  // All micro-batches first: each one's weight count_i / sum_j count_j needs the total before any backward.
  std::vector<data::Batch> batches;
  batches.reserve(static_cast<std::size_t>(config_.grad_accum));
  std::int64_t total = 0;
  std::int64_t samples = 0;
  for (std::int64_t i = 0; i < config_.grad_accum; ++i) {
    batches.push_back(on_device(train_loader_->next(), device_));
    total += batches.back().targets_count;
    samples += batches.back().samples;
  }
  MT_CHECK(config_.pipeline_stages == 1 || pipeline_, where,
           "config.pipeline_stages is {} but no stages are attached: launch with mpirun and call "
           "train::attach_gpt_pipeline", config_.pipeline_stages);
  MT_CHECK(config_.tensor_parallel == 1 || tensor_parallel_, where,
           "config.tensor_parallel is {} but no group is attached: launch with mpirun and call "
           "dist::attach_gpt_tensor_parallel", config_.tensor_parallel);
  MT_CHECK(config_.world_size == 1 || sync_, where,
           "config.world_size is {} but no ranks are attached: launch with mpirun and call "
           "dist::attach_data_parallel (train alone with world_size 1)", config_.world_size);
  if (sync_) {
    // Each micro-batch's weight is its share of the targets of the whole global batch.
    const std::vector<std::int64_t> all = sync_->gather_i64({total, samples});
    total = samples = 0;
    for (std::size_t r = 0; r < all.size(); r += 2) {
      total += all[r];
      samples += all[r + 1];
    }
  }
  MT_CHECK(total > 0, where, "step {}: the {} micro-batches hold no target elements", step_,
           config_.grad_accum * config_.world_size);
  // Layer-wise mode steps during the backward of the last micro-batch that runs one.
  std::size_t last_backward = 0;
  for (std::size_t i = 0; i < batches.size(); ++i)
    if (batches[i].targets_count > 0) last_backward = i;
  if (layerwise_) layerwise_->begin_step();

  // The canonical tree keeps each micro-batch's gradients apart until its subtree is complete.
  std::optional<detail::GradientTree> tree;
  if (canonical_reduction_on()) tree.emplace(pipeline_ ? detail::untied(*pipeline_, params) : params);
  std::vector<double> weighted_losses(batches.size(), 0.0);  // summed in global order after the loop
  if (sync_) sync_->begin_gradients(params, gradient_shards());
  if (pipeline_) {
    weighted_losses = pipeline_micro_batches(batches, total, *tree);
  } else {
    for (std::size_t i = 0; i < batches.size(); ++i) {
      data::Batch batch = std::move(batches[i]);
      if (batch.targets_count == 0) {  // its mean loss is 0/0 and its weight 0: nothing to add
        if (tree) tree->push_leaf();   // but the leaf keeps the tree's shape
        continue;
      }
      Tensor loss;
      mark(batches.size() > 1 ? fmt::format("forward {}/{}", i + 1, batches.size()) : std::string("forward"));
      const double weight = static_cast<double>(batch.targets_count) / static_cast<double>(total);
      const double seed = scaler_ ? weight * scaler_->scale() : weight;  // the backward's seed, known already
      {
        // What the forward pass allocates (and keeps for backward) is activation memory.
        autograd::EnableGradGuard grad_on;
        CategoryGuard category(MemoryCategory::activations);
        amp::Autocast autocast(autocast_mode());
        // A fused loss head makes its gradients during the forward for this seed (ops/fused_loss.h).
        std::optional<ops::LossGradientSeed> declared;
        if (config_.head_gradients_in_forward) declared.emplace(seed);
        std::optional<ops::HeadGemmsInComputeDtype> narrow_head;
        if (config_.head_gemms_in_compute_dtype) narrow_head.emplace();
        loss = loss_fn_(batch);
      }
      MT_CHECK(loss.defined() && loss.numel() == 1, where, "loss_fn must return a one-element tensor, got {}",
               loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"));
      MT_CHECK(loss.requires_grad(), where,
               "the loss of micro-batch {} does not require grad (no parameter took part?)", i);
      weighted_losses[i] = loss.item() * weight;
      Tensor seed_grad;
      {
        CategoryGuard category(MemoryCategory::gradients);
        seed_grad = full(loss.shape(), seed, loss.dtype(), loss.device());
      }
      // Alone, the hooks of the last backward step each parameter (completing its canonical sum first when the
      // last backward is the tree's last leaf; otherwise the step waits for the tree).
      std::optional<detail::LayerwiseUpdater::Backward> hooks_on;
      const bool tree_done_here = tree && i + 1 == batches.size();
      if (layerwise_ && !sync_)
        hooks_on.emplace(*layerwise_, i == last_backward && (!tree || tree_done_here),
                         tree_done_here ? &*tree : nullptr);
      // The last backward hands each gradient to the data-parallel sums as soon as it is final.
      std::optional<detail::SyncHooks::Active> overlap;
      if (sync_ && i + 1 == batches.size()) overlap.emplace(*sync_hooks_, *tree, *sync_);
      mark("backward");
      autograd::backward({loss}, {seed_grad});
      if (tree) tree->push_leaf();
    }
  }
  batches.clear();
  if (tree) tree->finish();
  if (sync_) {
    mark("gradient all-reduce");
    sync_->finish_gradients();
    weighted_losses = sync_->gather_f64(weighted_losses);
  }
  double loss_value = 0.0;
  for (const double l : weighted_losses) loss_value += l;

  mark("optimizer step");
  // ZeRO-1/2: this rank steps its shards, whose gradients are the summed shards themselves (ZeRO-2, taken
  // before anything reads them) or views of the summed whole gradients (ZeRO-1, taken once the loss scaler
  // has unscaled those); then the ranks exchange the stepped shards.
  const bool grad_shards = config_.zero >= 2 && !whole_params_.empty();
  if (grad_shards && !layerwise_) set_shard_gradients();  // layer-wise: each was set as its sum landed
  // fp16: gradients back in true units before anything reads them; an overflow skips the whole step.
  const std::optional<double> loss_scale = scaler_ ? std::optional<double>(scaler_->scale()) : std::nullopt;
  bool skipped = false;
  if (scaler_) {
    std::vector<Tensor> grads;
    if (grad_shards) {
      for (const Shard& s : shards_) grads.push_back(s.view.grad());
    } else {
      for (const Tensor& p : params) grads.push_back(p.grad());
    }
    skipped = !scaler_->unscale_(grads);
    // Each rank saw only its shards (or its stage): the step is skipped when any rank found an overflow.
    if (grad_shards || pipeline_ || tensor_parallel_) {
      const std::vector<std::int64_t> any =
          grad_shards ? sync_->gather_i64({skipped ? 1 : 0}) : gather_over_parts(skipped ? 1 : 0);
      skipped = std::find(any.begin(), any.end(), 1) != any.end();
    }
  }
  double grad_norm = 0.0;
  if (layerwise_) {
    // Each parameter was stepped as its gradient came; one whose gradient was not finite was left as it was.
    grad_norm = layerwise_->finish_step();
    if (!exchanged_params_.empty()) sync_->gather_shards(exchanged_params_, exchanged_aligns_);
    skipped = skipped || !std::isfinite(grad_norm) || !std::isfinite(loss_value);
  } else if (skipped) {
    // Not finite: nothing is clipped.
    grad_norm = grad_shards || tensor_parallel_ ? clip_gradients(params) : global_grad_norm(params);
  } else {
    if (!whole_params_.empty() && !grad_shards) set_shard_gradients();
    grad_norm = clip_gradients(params);
    // At any precision a NaN or Inf in the loss or any gradient skips the whole step, as an fp16 overflow does:
    // the optimizer's own gate would skip only the non-finite parameters and move the rest. The norm and the
    // loss are global, so every rank decides alike.
    skipped = !std::isfinite(grad_norm) || !std::isfinite(loss_value);
    if (!skipped) {
      optimizer_->step();
      if (!exchanged_params_.empty()) sync_->gather_shards(exchanged_params_, exchanged_aligns_);
    }
  }
  if (pipeline_) pipeline_share_tied();
  if (scaler_) scaler_->update(skipped);
  if (fp8_) {
    // Data parallel: every rank's scales follow the amaxes of the whole global batch, as the run alone's do.
    if (sync_) fp8_->merge_step_amaxes(params, sync_->gather_f64(fp8_->step_amaxes(params)));
    fp8_->update_scales();
  }
  optimizer_->zero_grad();
  if (!whole_params_.empty()) autograd::zero_grad(whole_params_);
  ++step_;

  StepMetrics m;
  m.step = step_;
  m.loss = loss_value;
  m.lr = base_lrs_.front() * scale;  // the first group's (all groups' unless the optimizer was built by hand)
  m.grad_norm = grad_norm;
  m.samples = samples;
  m.tokens = total;
  m.step_seconds = seconds_since(t0);
  m.peak_bytes = Allocator::get(device_).stats().peak_bytes;
  m.loss_scale = loss_scale;
  m.skipped = skipped;
  if (lisa_) m.lisa_blocks = lisa_->active();
  if (const std::optional<SyncBytes> bytes = sync_ ? sync_->last_step_bytes() : std::nullopt) {
    m.grad_bytes_sent = bytes->sent;
    m.grad_bytes_dense = bytes->dense;
  }
  history_.push_back(m);
  return m;
}

amp::AutocastMode Trainer::autocast_mode() const { return {compute_dtype_, fp8_.get(), config_.weight_casts}; }

void Trainer::mark_phases_on(MemoryTimeline* timeline) {
  timeline_ = timeline;
  ::memtrain::detail::set_phase_listener(
      timeline ? ::memtrain::detail::PhaseListener([timeline](const std::string& p) { timeline->mark(p); }) : nullptr);
}

void Trainer::mark(const std::string& phase) const {
  if (timeline_ != nullptr) timeline_->mark(phase);
}

double Trainer::evaluate() {
  MT_CHECK(val_loader_ != nullptr, "Trainer::evaluate", "no validation dataset was given");
  mark("eval");
  // Evaluation must not move the training RNG stream, or eval_interval would change the training run.
  RngStateGuard rng;
  // Nor may it move the fp8 delayed-scaling state: its amaxes would set later training scales.
  const std::optional<amp::Fp8State> fp8_before = fp8_ ? std::optional<amp::Fp8State>(*fp8_) : std::nullopt;
  struct Fp8Restorer {
    amp::Fp8State* live;
    const std::optional<amp::Fp8State>& saved;
    ~Fp8Restorer() {
      if (live) *live = *saved;
    }
  } fp8_restore{fp8_.get(), fp8_before};
  autograd::NoGradGuard no_grad;
  TrainModeRestorer restore{*model_};
  model_->eval();
  val_loader_->seek({0, 0});
  // At most one pass: a val set of fewer batches than eval_batches is evaluated once, not wrapped around.
  const std::int64_t n = std::min(config_.eval_batches, val_loader_->batches_per_epoch());
  double sum = 0.0;
  std::int64_t count = 0;
  EvalResult result;
  for (std::int64_t i = 0; i < n; ++i) {
    data::Batch batch = val_loader_->next();
    ++result.batches;
    result.samples += batch.samples;
    if (batch.targets_count == 0) continue;
    batch = on_device(std::move(batch), device_);
    CategoryGuard category(MemoryCategory::activations);
    amp::Autocast autocast(autocast_mode());
    double loss = 0.0;
    if (pipeline_) {
      loss = pipeline_eval_loss(batch);
    } else {
      const Tensor t = loss_fn_(batch);
      MT_CHECK(t.defined() && t.numel() == 1, "Trainer::evaluate", "loss_fn must return a one-element tensor");
      loss = t.item();
    }
    sum += loss * static_cast<double>(batch.targets_count);
    count += batch.targets_count;
  }
  if (pipeline_) sum = pipeline_->link->gather_f64({sum}).back();  // the last stage's
  result.tokens = count;
  result.loss = count > 0 ? sum / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
  last_eval_ = result;
  return result.loss;
}

RunSummary Trainer::summarize(const std::vector<StepMetrics>& ran) const {
  Allocator& allocator = Allocator::get(device_);
  RunSummary summary = detail::summarize(config_, ran, allocator.stats(), optimizer_->state_bytes());
  // A compressing sync: this rank's gradient bytes over the run, and how many times fewer than dense.
  double sent = 0.0, dense = 0.0;
  bool compressed = false;
  for (const StepMetrics& m : ran) {
    if (!m.grad_bytes_sent) continue;
    compressed = true;
    sent += static_cast<double>(*m.grad_bytes_sent);
    dense += static_cast<double>(m.grad_bytes_dense.value_or(0));
  }
  if (compressed) {
    summary.metrics["grad_bytes_sent_total"] = sent;
    summary.metrics["grad_bytes_dense_total"] = dense;
    summary.metrics["grad_compression_ratio"] = sent > 0.0 ? dense / sent : 0.0;
  }
  if (pipeline_) summary.stages = detail::stage_table(*pipeline_, allocator.stats(), optimizer_->state_bytes());
  // Every rank of a data-parallel or tensor-parallel run: each holds its own share (ZeRO shards, parts). Beside
  // a pipeline or tensor parallelism, the model group's first, then the data group's: the launcher's order (rank =
  // data x model ranks + the rank in the model).
  if (sync_ || tensor_parallel_) {
    summary.ranks = detail::rank_memory_table(
        [this](const std::vector<double>& mine) {
          const std::vector<double> model = pipeline_          ? pipeline_->link->gather_f64(mine)
                                            : tensor_parallel_ ? tensor_parallel_->gather_f64(mine)
                                                               : mine;
          return sync_ ? sync_->gather_f64(model) : model;
        },
        "rank", allocator.stats(), optimizer_->state_bytes());
  }
  if (offload_) summary.offloaded_state_bytes = offload_->peak_bytes();
  summary.device = device_.str();
  summary.host_peak_bytes = Allocator::get(Device::cpu()).stats().peak_bytes;
  if (summary.final_val_loss) summary.final_eval = last_eval_;
  return summary;
}

RunSummary Trainer::evaluate_and_summarize() {
  evaluate();
  RunSummary summary = summarize({});
  summary.final_val_loss = last_eval_->loss;
  summary.final_eval = last_eval_;
  // Every rank of a multi-rank run evaluates (the losses are summed over them); one writes.
  if (!config_.summary_path.empty() && writes_files()) write_summary(summary, config_.summary_path);
  return summary;
}

RunSummary Trainer::fit() {
  Allocator& allocator = Allocator::get(device_);
  Allocator& host = Allocator::get(Device::cpu());
  allocator.reset_peak();
  if (&host != &allocator) host.reset_peak();
  std::optional<detail::MetricsWriter> metrics;
  // A resumed run continues the metrics file of the run it resumes.
  // In a data-parallel run every rank computes the same metrics; rank 0 writes and prints them.
  const bool writes = writes_files();
  // Every place this run will write is tried now, so a read-only directory stops it before its first step,
  // not at its first checkpoint an hour later. Under ZeRO every rank writes its shard of a checkpoint.
  if (config_.checkpoint_interval > 0 && (writes || !whole_params_.empty() || pipeline_ || tensor_parallel_))
    ::memtrain::detail::require_writable_dir(config_.checkpoint_dir, "Trainer::fit", "checkpoint_dir");
  if (writes && !config_.summary_path.empty())
    ::memtrain::detail::require_writable_dir(directory_of(config_.summary_path), "Trainer::fit",
                                             "the directory of summary_path");
  if (offload_) check_offload_room();
  if (writes && !config_.metrics_path.empty()) metrics.emplace(config_.metrics_path, /*append=*/step_ > 0);
  std::optional<detail::ProgressPrinter> progress;
  if (writes) progress.emplace(config_.max_steps, config_.log_interval, ::isatty(STDERR_FILENO) == 1);

  const std::size_t first = history_.size();
  const std::int64_t start_step = step_;
  const auto start = Clock::now();
  std::int64_t bad_in_a_row = 0;
  std::string stopped;
  while (step_ < config_.max_steps) {
    StepMetrics m = train_step();
    const bool last = step_ == config_.max_steps;
    if (val_loader_ && ((config_.eval_interval > 0 && step_ % config_.eval_interval == 0) || last)) {
      m.val_loss = evaluate();
      history_.back().val_loss = m.val_loss;
    }
    if (metrics) metrics->write(m);
    const double per_step = seconds_since(start) / static_cast<double>(step_ - start_step);
    if (progress) progress->update(m, per_step * static_cast<double>(config_.max_steps - step_));
    // Not after a skipped step: it moved nothing, yet as the newest file it would prune a good one, and a
    // diverged run would end with only checkpoints of its bad steps.
    bad_in_a_row = m.skipped ? bad_in_a_row + 1 : 0;
    if (config_.checkpoint_interval > 0 && (step_ % config_.checkpoint_interval == 0 || last) && !m.skipped)
      save_checkpoint();
    if (on_step) on_step(m);
    if (config_.max_bad_steps > 0 && bad_in_a_row >= config_.max_bad_steps) {
      const std::string kept = latest_checkpoint(checkpoint_dir());
      stopped = fmt::format("steps {} to {} were all skipped (a non-finite loss or gradient norm), max_bad_steps = "
                            "{}; {}",
                            step_ - bad_in_a_row + 1, step_, config_.max_bad_steps,
                            kept.empty() ? std::string("no checkpoint was written") : "the last checkpoint is " + kept);
      break;
    }
  }
  if (progress) progress->finish();

  const std::vector<StepMetrics> ran(history_.begin() + static_cast<std::ptrdiff_t>(first), history_.end());
  RunSummary summary = summarize(ran);
  summary.stopped = stopped;
  // The summary is written first, so a stopped run still leaves its figures.
  const auto stop_if_asked = [&stopped] { MT_CHECK(stopped.empty(), "Trainer::fit", "stopped: {}", stopped); };
  if (!writes) {
    stop_if_asked();
    return summary;
  }
  if (memory_notes) {
    const std::string notes = memory_notes();
    if (!notes.empty()) fmt::print(stderr, "{}\n", notes);
  }
  // A device run has two reports: the host's (data batches, staging) and the device's (the training).
  if (&host != &allocator) std::fprintf(stderr, "%s", host.report().c_str());
  std::fprintf(stderr, "%s", allocator.report().c_str());
  if (offload_)
    fmt::print(stderr, "optimizer state in {}: {} (not in the figures above)\n", offload_->where(),
               detail::format_bytes(summary.offloaded_state_bytes));
  fmt::print(stderr, "{} steps{}, final loss {:.4f}{}, {} tokens/s, median step {:.3f} s, peak {}, peak RSS {}\n",
             summary.steps,
             summary.skipped_steps > 0 ? fmt::format(" ({} skipped)", summary.skipped_steps) : std::string(),
             summary.final_train_loss,
             summary.final_eval ? fmt::format(" (val {:.4f} over {} samples in {} batches)", summary.final_eval->loss,
                                              summary.final_eval->samples, summary.final_eval->batches)
                                : std::string(),
             detail::format_rate(summary.tokens_per_second), summary.median_step_seconds,
             detail::format_bytes(summary.peak_bytes_total), detail::format_bytes(summary.peak_rss_bytes));
  if (!config_.summary_path.empty()) write_summary(summary, config_.summary_path);
  stop_if_asked();
  return summary;
}

}  // namespace memtrain::train
