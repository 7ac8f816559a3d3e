// Trainer: runs the loop a training program would otherwise write by hand.
//
//   for step in [step(), max_steps):
//     lr = schedule(step); grad_accum micro-batches: loss_i = loss_fn(batch_i);
//     backward(loss_i * count_i / sum_j count_j)     // exact mean over the whole effective batch,
//                                                     // also when the last micro-batch is partial
//     clip by global norm; optimizer step; zero grads; metrics; eval / checkpoint when due
//
// Precision (config.precision, amp/precision.h): with bf16 or fp16 each micro-batch's forward (and
// evaluate()) runs under amp::Autocast, so activations and the compute copies of weights are narrow while the
// optimizer keeps f32 weights. fp16 seeds backward with the loss scale, unscales the gradients before
// clipping, and skips the step (no parameter or optimizer state changes) when any gradient is Inf/NaN; the
// scaler's state is saved in checkpoint files ("amp.loss_scaler.*"). fp8 runs every linear in FP8
// (amp::fp8_linear) with the recipe of config.fp8_scaling; delayed scales are updated after each step,
// evaluate() leaves them as they were, and checkpoint files keep them ("amp.fp8.<weight name>.*").
//
// With config.layerwise_update, hooks registered once by the constructor step each parameter during the
// backward of the last micro-batch and free its gradient at once (src/train/layerwise.h), so the gradient
// peak is about one layer's. Without clipping the parameters end bit-identical to the ordinary step's (GaLore
// with grad_accum > 1: to fp32 rounding, as its weights accumulate earlier micro-batches in the projected
// space). grad_clip clips each parameter to its share grad_clip * sqrt(n_p / N) of the threshold, which keeps
// the global norm of the applied gradients <= grad_clip (the global norm is known only once all are applied).
// The hooks stay on the parameters after the Trainer is gone and do nothing then. Data parallel, the hooks go
// quiet and each parameter, or this rank's ZeRO shard of it, is stepped as its sum over the ranks lands
// (GradientSync::set_landed, docs/distributed.md).
//
// Progress: on a terminal one live line (step/total, loss, lr, tokens/s or samples/s, peak memory, ETA);
// otherwise a plain line every log_interval steps. Per-step metrics go to config.metrics_path (JSONL). At
// the end of fit(): the memory report and the run summary (config, final train/val loss, throughput, step
// time, peak bytes per category and in total, peak RSS), written to config.summary_path when set.
//
// Checkpoints are one safetensors file, ckpt_<step, 8 digits>.safetensors in checkpoint_dir, written
// atomically: "model.<name>", "optim.<key>" (and for fp16 / fp8 "amp.<key>") tensors, and metadata with the
// step, the RNG state, the loader position and the config JSON. load_checkpoint() restores all of it, so a run stopped at step k
// and resumed continues bit for bit as if it had not stopped (CPU).
//   metadata keys: format ("memtrain-checkpoint"), format_version ("1"), step, rng_seed, rng_offset,
//   loader_epoch, loader_batch, optimizer (its kind_name), config (TrainerConfig JSON)
//
// Randomness: the Trainer does not reseed the default RNG stream (dropout draws from it); call
// manual_seed(config.seed) before building the model. The loaders are seeded from config.seed.
// Device (config.device): the constructor moves the model there in place (nn::Module::to; before the optimizer
// is built), and every training and evaluation batch is copied there as it is used; loss_fn sees batches on
// the model's device. On CUDA, gradient clipping and fp16 unscaling run on the device; fit() prints the host's
// memory report and then the device's.
// Memory: the allocator's peak is reset when the Trainer is made and when fit() starts, so reported peaks
// cover training (live parameters included). memory_budget_bytes, when set, is the budget of the model's
// device's allocator while the Trainer lives; the previous budget is restored by the destructor.
#pragma once

#include "memtrain/amp/autocast.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/amp/loss_scaler.h"
#include "memtrain/data/loader.h"
#include "memtrain/nn/module.h"
#include "memtrain/optim/optimizer.h"
#include "memtrain/train/gradient_sync.h"
#include "memtrain/train/timeline.h"
#include "memtrain/train/trainer_config.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace memtrain::nn {
class GPT;
}  // namespace memtrain::nn

namespace memtrain::train {

class PipelineLink;
class TensorParallelLink;

namespace detail {
class GradientTree;
struct PipelineStage;
class LayerwiseUpdater;
class Lisa;
class SyncHooks;
}  // namespace detail

// Mean loss over batch.targets_count target elements (a one-element tensor that requires grad). Called in
// training mode for training batches; evaluate() calls it in eval mode under NoGrad.
using LossFn = std::function<Tensor(const data::Batch&)>;

struct StepMetrics {
  std::int64_t step = 0;  // optimizer steps done, this one included
  double loss = 0.0;      // mean over the effective batch
  double lr = 0.0;        // the first parameter group's lr this step
  double grad_norm = 0.0;  // global L2 norm before clipping
  std::int64_t samples = 0;
  std::int64_t tokens = 0;  // target elements (tokens for LMs, samples for classifiers)
  double step_seconds = 0.0;
  std::size_t peak_bytes = 0;  // allocator total peak so far
  std::optional<double> val_loss;  // when an eval ran after this step
  // fp16 only: the loss scale this step's backward was seeded with, and whether its gradients overflowed
  // (then no parameter changed and the scale backed off).
  std::optional<double> loss_scale;
  // No parameter moved: the loss or the global gradient norm was not finite (any precision), or fp16's
  // gradients overflowed. Layer-wise updates step each parameter as its gradient comes, so there only the
  // parameters whose own gradient was not finite stayed as they were.
  bool skipped = false;
  // LISA only (TrainerConfig.lisa_layers): the blocks that trained this step, by index.
  std::vector<std::int64_t> lisa_blocks;
  // Compressed data parallel only (TrainerConfig::grad_compression): this rank's gradient bytes sent this step,
  // and the bytes of the same gradients sent dense (GradientSync::last_step_bytes).
  std::optional<std::int64_t> grad_bytes_sent, grad_bytes_dense;
  // {"step", "loss", "lr", "grad_norm", "samples", "tokens", "step_seconds", "tokens_per_s", "peak_bytes",
  //  "skipped" [, "val_loss"] [, "loss_scale"] [, "lisa_blocks"] [, "grad_bytes_sent", "grad_bytes_dense"]}:
  //  one line of the metrics JSONL.
  nlohmann::json to_json() const;
};

// What one evaluate() went over: every val sample at most once (a val set smaller than eval_batches batches
// is evaluated once, not wrapped around).
struct EvalResult {
  double loss = 0.0;          // mean over `tokens` target elements (NaN when there were none)
  std::int64_t batches = 0;   // val batches evaluated
  std::int64_t samples = 0;   // val samples (LM windows, images) evaluated
  std::int64_t tokens = 0;    // target elements evaluated (tokens for LMs, samples for classifiers)
};

// What fit() reports at the end, over the steps that fit() call ran.
struct RunSummary {
  nlohmann::json config;
  std::int64_t steps = 0;  // optimizer steps this fit() ran (0 for an evaluation alone)
  std::int64_t skipped_steps = 0;  // of those, the ones that moved no parameter (StepMetrics::skipped)
  // Why fit() stopped before max_steps (config.max_bad_steps skipped steps in a row); empty when it did not.
  std::string stopped;
  double final_train_loss = 0.0;
  std::optional<double> final_val_loss;
  std::optional<EvalResult> final_eval;  // the evaluation final_val_loss came from: what it went over
  double tokens_per_second = 0.0;
  double samples_per_second = 0.0;  // sequences for LMs, images for classifiers
  double median_step_seconds = 0.0;
  std::map<std::string, std::size_t> peak_bytes_by_category;  // what was live per category at the total peak
  std::size_t peak_bytes_total = 0;
  std::size_t optimizer_state_bytes = 0;
  // With config.offload_optimizer: the most optimizer state its files held, outside the peaks above; 0 otherwise.
  std::size_t offloaded_state_bytes = 0;
  std::size_t peak_rss_bytes = 0;
  std::size_t reserved_bytes = 0;  // the device allocator's reserved bytes at the end (blocks in use + cache)
  std::size_t reserved_peak_bytes = 0;  // their peak over the run
  std::string device = "cpu";       // where the model trained; the peaks above are that device's allocator's
  std::size_t host_peak_bytes = 0;  // the CPU allocator's peak (the same as peak_bytes_total on a CPU run)
  // A pipeline run: one entry per stage, in stage order, with its "peak_bytes_total", its own peak of each
  // category ("peak_bytes_by_category"), "optimizer_state_bytes", and "idle_fraction" (the share of its
  // micro-batch loop spent waiting for the other stages); null otherwise.
  nlohmann::json stages;
  // A data-parallel or tensor-parallel run: one entry per rank, in rank order, with "rank", "peak_bytes_total",
  // "peak_bytes_by_category" (its own peak of each) and "optimizer_state_bytes"; null otherwise.
  nlohmann::json ranks;
  // A program's own results (e.g. test_accuracy), written as top-level keys beside the fields above.
  std::map<std::string, double> metrics;
  // Field names as above; peak_bytes_by_category keyed by category_name; final_val_loss null when absent;
  // final_eval as "val_batches", "val_samples", "val_tokens" (null when absent); final_train_loss null when
  // no step ran; then each of metrics (a name that clashes with a field is an error).
  nlohmann::json to_json() const;
};

// Writes summary.to_json() to path atomically (what fit() does with config.summary_path).
void write_summary(const RunSummary& summary, const std::string& path);

class Trainer {
 public:
  // Validates config, builds the optimizer from config.optimizer over decay groups of model's parameters
  // (no decay for rank < 2; with galore_rank > 0, GaLore over the weights galore_targets chooses, refused
  // listing the model's 2-D parameters when it chooses none), and the loaders (seeded from config.seed; train: micro_batch, data.shuffle,
  // data.drop_last; val: in order, the last batch may be partial). val may be null (no evaluation).
  Trainer(TrainerConfig config, std::shared_ptr<nn::Module> model, LossFn loss_fn,
          std::shared_ptr<const data::Dataset> train, std::shared_ptr<const data::Dataset> val = nullptr);
  // The same with an optimizer the caller built over the model's parameters (any groups, lrs, kind; an
  // optim::GaLore with its own targets) in place of config.optimizer and the GaLore fields, which are then
  // unused. The model is moved to config.device in place, so the optimizer may be built before. The schedule
  // scales each group's own lr as the optimizer has it now; clipping, layer-wise updates and checkpoints work
  // as with the config's optimizer (checkpoints save its state_dict keys; resume with an optimizer built the
  // same way). Refused, with the reason: a null optimizer, one holding a tensor that is not a parameter of
  // the model or none at all, a model parameter that requires grad but is in no group (freeze it with
  // requires_grad false), and config.galore_rank > 0 (the config would ask for GaLore that the given
  // optimizer does not do: set it to 0).
  Trainer(TrainerConfig config, std::shared_ptr<nn::Module> model, std::unique_ptr<optim::Optimizer> optimizer,
          LossFn loss_fn, std::shared_ptr<const data::Dataset> train,
          std::shared_ptr<const data::Dataset> val = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains from step() to config.max_steps: evaluates every eval_interval steps and after the last one
  // (when val was given), checkpoints every checkpoint_interval steps and after the last one (when set),
  // writes metrics and progress, and at the end prints the memory report and writes the summary.
  RunSummary fit();
  // One optimizer step (grad_accum micro-batches); appends to history(). No eval, metrics file or progress.
  StepMetrics train_step();
  // Mean loss (weighted by targets_count) over the first min(eval_batches, one pass) val batches, in eval
  // mode under NoGrad; leaves the model in training mode and the default RNG stream as it was. last_eval()
  // says what it went over.
  double evaluate();
  const std::optional<EvalResult>& last_eval() const { return last_eval_; }
  // For a run that only evaluates: evaluate(), then the summary of it (steps 0, the memory peaks since the
  // Trainer was made), written to config.summary_path when set.
  RunSummary evaluate_and_summarize();

  // While `timeline` (not owned; nullptr to stop) is set, the step's phases are marked on it as they start:
  // "forward" (with the micro-batch, "forward 2/4", when accumulating), each block of a model whose blocks run
  // through ckpt::BlockCheckpointer ("block 3/12", in the training forward), "backward", "optimizer step", "eval",
  // "checkpoint save". Marks come from this thread.
  void mark_phases_on(MemoryTimeline* timeline);

  // Trains as rank sync->rank() of sync->world_size() (dist::attach_data_parallel calls it): the train loader
  // then hands this rank its block of each step's micro-batches, and each step's gradients, target counts and
  // losses are summed over every rank. Only rank 0 writes files (checkpoints, metrics, summary) and prints.
  // Refused after the first step, when config.world_size differs from the group's, or when the configs differ
  // between ranks.
  void set_gradient_sync(std::shared_ptr<GradientSync> sync);
  // Whether this process writes the run's files and prints its report (rank 0, or a run alone).
  bool writes_files() const;
  // Makes this trainer stage link->stage() of a pipeline (train/pipeline.h) over `model`, the GPT stage it was
  // built over; what dist::attach_gpt_pipeline calls once it has checked the ranks agree. Before the first step,
  // with the config's optimizer.
  void attach_pipeline(std::shared_ptr<PipelineLink> link, std::shared_ptr<const nn::GPT> model);
  // Makes this trainer rank link->rank() of a tensor-parallel group (train/tensor_parallel.h); `split` are the
  // model's parameters of which this rank holds a part (the others are whole on every rank). What
  // dist::attach_gpt_tensor_parallel calls once it has checked the ranks agree. Before the first step.
  void attach_tensor_parallel(std::shared_ptr<TensorParallelLink> link, const std::vector<Tensor>& split);

  // Into checkpoint_dir (a pipeline stage: its subdirectory "stage<s>-of-<P>", the file's metadata naming the
  // stage; a tensor-parallel rank: "tensor<r>-of-<T>"; every part calls it at the same step and writes its own);
  // returns the path; prunes old ones.
  std::string save_checkpoint();
  void save_checkpoint(const std::string& path) const;
  // Throws naming the file and what does not match, before anything changes: every name, shape and dtype is
  // checked against the file's header first. Then each tensor is read from the file straight into the parameter
  // or optimizer state it restores, so nothing is held twice. The optimizer's state is replaced only once all of
  // it has loaded; a read of the model that fails after the checks (the file changed underneath) leaves the model
  // partly loaded, and the error says to load again.
  void load_checkpoint(const std::string& path);
  // Loads the newest checkpoint of config.checkpoint_dir; false when there is none. A pipeline stage (a
  // tensor-parallel rank) loads the newest step that every stage (rank) holds. A file resumes only the pipeline
  // or tensor-parallel layout (or none) it was written with.
  bool resume_latest();

  std::int64_t step() const { return step_; }
  const TrainerConfig& config() const { return config_; }
  nn::Module& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  data::Loader& train_loader() { return *train_loader_; }
  const std::vector<StepMetrics>& history() const { return history_; }
  const amp::DynamicLossScaler* loss_scaler() const { return scaler_.get(); }  // null unless fp16
  const amp::Fp8State* fp8_state() const { return fp8_.get(); }                 // null unless fp8

  // Called after every optimizer step (after eval/checkpoint of that step), e.g. to print samples.
  std::function<void(const StepMetrics&)> on_step;
  // Extra lines fit() prints just above its memory report (e.g. the model's checkpoint plan); may be empty.
  std::function<std::string()> memory_notes;

 private:
  TrainerConfig config_;
  std::shared_ptr<nn::Module> model_;
  LossFn loss_fn_;
  std::shared_ptr<const data::Dataset> val_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<const data::Dataset> train_;
  std::unique_ptr<data::Loader> train_loader_;
  std::shared_ptr<GradientSync> sync_;  // data parallel; null when training alone
  std::shared_ptr<detail::SyncHooks> sync_hooks_;  // with sync_: its gradient-ready hooks
  std::shared_ptr<detail::PipelineStage> pipeline_;  // pipeline parallel (train/pipeline.h); null otherwise
  std::shared_ptr<TensorParallelLink> tensor_parallel_;  // tensor parallel (train/tensor_parallel.h); or null
  std::unordered_set<const void*> split_params_;  // tensor parallel: the parameters held in part, by their impl
  // The global norm of params' gradients, and into `grads` what a clip scales: over every tensor-parallel rank's
  // parts; in the canonical order (ZeRO-2: over the shards' gradients; a pipeline: over every stage's); or alone.
  double tensor_parallel_norm(const std::vector<Tensor>& params, std::vector<Tensor>& grads) const;
  double canonical_norm(const std::vector<Tensor>& params, std::vector<Tensor>& grads) const;
  // trainer_pipeline.cpp: a step's micro-batches through the stages (the loss weighted per micro-batch, every
  // rank's copy of the last stage's), one val batch's loss (NaN off the last stage), the tied weight's update.
  std::vector<double> pipeline_micro_batches(std::vector<data::Batch>& batches, std::int64_t total,
                                             detail::GradientTree& tree);
  double pipeline_eval_loss(const data::Batch& batch);
  void pipeline_share_tied();
  // config.checkpoint_dir, or the subdirectory of it where a pipeline stage or a tensor-parallel rank keeps its
  // part of the model.
  std::string checkpoint_dir() const;
  std::vector<std::int64_t> gather_over_parts(std::int64_t mine) const;  // every stage's or tensor rank's value
  // Whether this rank writes the main checkpoint file of its part of the model: the data rank 0 of every pipeline
  // stage or tensor-parallel part (alone: of the whole model).
  bool writes_checkpoint() const;
  bool resume_latest_part();
  bool user_optimizer_ = false;                    // given to the constructor, not built from the config
  // config.offload_optimizer (trainer_offload.cpp): the arena the optimizer's state lives in, or null. Set on
  // every optimizer the trainer builds (setup, ZeRO's shards) before it makes any state.
  std::shared_ptr<StateArena> offload_;
  void set_up_offload();
  // fit()'s start-up check: the directory has room for the state the next step makes (none once it exists).
  void check_offload_room() const;
  // ZeRO-1 (config.zero >= 1 with a sync): the optimizer holds views of this rank's shard of each parameter;
  // whole_params_ are the parameters themselves, in the groups' order. A GaLore-projected weight is held whole
  // (every rank steps it alike) and only its state is sharded, over the elements of its projected gradient R.
  // Adafactor's shards are whole rows (align a multiple of the row length), and every rank holds a view of
  // every parameter, empty ones included, since its step exchanges statistics for each.
  struct Shard {
    Tensor whole;
    Tensor view;  // what the optimizer steps: elements [begin, begin + count) of whole, flattened (or whole)
    std::int64_t begin = 0, count = 0;  // the range of the state: of whole's elements, or of R's when projected
    std::size_t index = 0;              // of whole in whole_params_ (the key of its state in checkpoints)
    bool projected = false;
    std::int64_t align = 256;  // GradientSync::shard_bounds's
  };
  std::vector<Tensor> whole_params_;
  std::vector<Tensor> exchanged_params_;  // those of whole_params_ whose stepped shards the ranks exchange
  std::vector<std::int64_t> exchanged_aligns_;  // their shards' alignment
  std::vector<Shard> shards_;
  std::vector<std::ptrdiff_t> shard_at_;  // by index in whole_params_: the first of shards_ for it, or -1
  const Shard* shard_of(std::size_t index) const;  // nullptr when this rank holds none of it
  std::vector<Tensor> landed_params_;  // layer-wise data parallel: trained_params(), by GradientSync's index
  void shard_optimizer();
  void shard_adafactor_rows();  // the exchanges of Adafactor's row-shard step (optim::Adafactor::shard_rows)
  // Layer-wise data parallel: steps parameter `index` (or this rank's shard) once its sum has landed.
  void step_landed(std::size_t index, double norm);
  // Gives this rank's shards their gradients: the summed shards (ZeRO-2) or views of the whole gradients.
  void set_shard_gradients();
  void set_shard_gradient(const Shard& s);  // one shard's
  // Indices into trained_params() in the order the backward is expected to finish them (GradientSync::
  // expect_order): the model's parameters in reverse registration order.
  std::vector<std::size_t> backward_order() const;
  // ZeRO-2: for each of whole_params_, the alignment of its reduce-scattered gradient's shards, or 0 for a
  // GaLore-projected weight, whose projection needs the whole gradient (summed whole, as at ZeRO-1). Empty
  // below ZeRO-2.
  std::vector<std::int64_t> gradient_shards() const;
  // The shape of parameter i's (of trained_params()) optimizer state: R's for a GaLore-projected weight.
  Shape state_shape(std::size_t i) const;
  std::vector<Tensor> trained_params() const;  // whole_params_, or the optimizer's
  bool canonical_reduction_on() const;          // the canonical tree (and, on the CPU, the canonical norm)
  double clip_gradients(const std::vector<Tensor>& params);  // clips by config.grad_clip; returns the norm
  // The optimizer state in checkpoint keys ("<index in trained_params()>.<name>"): the optimizer's own keys
  // unless it holds ZeRO-1 shards.
  optim::StateDict state_by_param_index() const;
  // The optimizer state of a checkpoint (`in_file`, its optimizer entries, or its ranks' shard files) cut to
  // what this trainer steps and keyed by its optimizer's slots, for where either the file or this trainer holds
  // ZeRO-1 shards: read on demand, each rank reading only its share (load_checkpoint reads an unsharded state
  // into an unsharded trainer straight from the file).
  std::unique_ptr<TensorSource> checkpoint_state(const std::string& path,
                                                 const std::map<std::string, std::string>& meta,
                                                 const TensorSource& in_file) const;
  void store_params_narrow(const nn::NamedTensors& trained);
  void make_train_loader(std::int64_t rank, std::int64_t world_size);
  std::unique_ptr<data::Loader> val_loader_;
  std::vector<double> base_lrs_;  // each group's lr at construction; the schedule scales them
  std::shared_ptr<detail::LayerwiseUpdater> layerwise_;  // with config.layerwise_update
  std::unique_ptr<detail::Lisa> lisa_;                   // with config.lisa_layers
  DType compute_dtype_ = DType::f32;                     // amp::Autocast dtype of forward passes
  std::unique_ptr<amp::DynamicLossScaler> scaler_;       // fp16
  std::unique_ptr<amp::Fp8State> fp8_;                   // fp8: recipe and delayed-scaling state
  amp::AutocastMode autocast_mode() const;
  void setup(std::shared_ptr<const data::Dataset> train);  // both constructors; optimizer_ set when given
  std::int64_t step_ = 0;
  std::vector<StepMetrics> history_;
  std::optional<EvalResult> last_eval_;
  RunSummary summarize(const std::vector<StepMetrics>& ran) const;  // memory, devices, last_eval_
  Device device_ = Device::cpu();  // of the model's parameters: whose allocator the budget and peaks are
  bool budget_set_ = false;
  MemoryTimeline* timeline_ = nullptr;
  void mark(const std::string& phase) const;
  std::optional<std::size_t> previous_budget_;
};

// "ckpt_00000042.safetensors" for step 42.
std::string checkpoint_filename(std::int64_t step);
// Newest "ckpt_<digits>.safetensors" regular file in dir (by step), or empty (also when dir does not exist).
// Temp files of an interrupted write ("...safetensors.tmp.<pid>") never match.
std::string latest_checkpoint(const std::string& dir);
// Deletes all but the `keep` newest checkpoints of dir; returns the paths removed.
std::vector<std::string> prune_checkpoints(const std::string& dir, std::int64_t keep);
// Deletes the temp files that saves killed mid-write left in dir ("ckpt_<digits>.safetensors.tmp.<pid>" of a
// process no longer running on this machine), so a run killed again and again does not fill the disk with
// them; returns the paths removed. Trainer::save_checkpoint calls it after each complete save.
std::vector<std::string> remove_stale_checkpoint_temps(const std::string& dir);

// Global L2 norm over the gradients of params (those without a gradient count as zero), summed in double.
double global_grad_norm(const std::vector<Tensor>& params);
// Scales every gradient by max_norm / (norm + 1e-6) when the global norm exceeds max_norm (as PyTorch's
// clip_grad_norm_); a non-finite norm leaves them as they are (the optimizer skips non-finite gradients).
// Returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// Peak resident set size of this process (from /proc/self/status VmHWM), in bytes.
std::size_t peak_rss_bytes();
// Resident set size of this process now (VmRSS), in bytes; 0 where /proc is absent.
std::size_t current_rss_bytes();
// Hands the free pages of the C heap back to the OS (glibc's malloc_trim; nothing under another C library).
// oneDNN mallocs its GEMM packing buffers call by call and glibc keeps the freed ones resident (122 MiB of heap
// on gpt2-124M's fp32 step); the Trainer calls this before each step so that they do not add to its peak RSS.
void release_free_heap();

}  // namespace memtrain::train
