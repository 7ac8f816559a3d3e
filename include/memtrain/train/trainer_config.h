// TrainerConfig: everything that defines a training run, as one value that round-trips through JSON, so a
// run can be reproduced from its file (`--config run.json`). Options that later issues add (precision,
// activation checkpointing, GaLore, world_size > 1) have their fields here already; validate() refuses a
// value the library cannot run yet, or a combination that cannot work, with the reason.
#pragma once

#include "memtrain/amp/fp8.h"
#include "memtrain/amp/loss_scaler.h"
#include "memtrain/amp/precision.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/core/device.h"
#include "memtrain/nn/lora_config.h"
#include "memtrain/optim/galore_projector.h"
#include "memtrain/optim/spec.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memtrain::train {

// What the example programs build; the Trainer itself only records it (in checkpoints and summaries).
struct ModelConfig {
  std::string preset = "tiny";  // nn::GPTConfig::preset names, "llama-*" presets, "cnn" or "efficientnet"
  std::int64_t seq_len = 0;     // 0 = the preset's block_size
  double dropout = 0.0;
  std::string init_from;        // optional HF GPT-2 model.safetensors
};

struct DataConfig {
  std::vector<std::string> train;  // token shards, or a directory (IDX files for images)
  std::vector<std::string> val;
  std::int64_t prefetch = 2;
  bool shuffle = true;
  // true: every training batch is full (the tail of an epoch is skipped); false: the last micro-batch of an
  // epoch may be smaller, and the Trainer still averages exactly over the samples it saw.
  bool drop_last = true;
};

enum class LrDecay { cosine, constant };
const char* lr_decay_name(LrDecay decay);               // "cosine", "constant"
LrDecay lr_decay_from_name(const std::string& name);  // throws listing the names

// lr(step) for step = 0, 1, ... (W = warmup_steps, N = max_steps, m = lr * min_lr_ratio):
//   step < W:        lr * (step + 1) / W                                   (linear warmup, reaching lr at W-1)
//   cosine:          m + (lr - m) * (1 + cos(pi * (step - W) / (N - W))) / 2  (lr at W, m at N; m past N)
//   constant:        lr
struct LrSchedule {
  std::int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  LrDecay decay = LrDecay::cosine;
  double lr_at(std::int64_t step, double peak_lr, std::int64_t max_steps) const;
};

struct TrainerConfig {
  ModelConfig model;
  DataConfig data;
  optim::Spec optimizer = optim::Spec::adamw({.lr = 6e-4, .weight_decay = 0.1});
  LrSchedule schedule;
  double grad_clip = 1.0;  // global L2 norm; 0 = off
  std::int64_t micro_batch = 8;
  std::int64_t grad_accum = 1;
  // Data-parallel ranks: a run launched by mpirun takes the launcher's count (dist::attach_data_parallel
  // checks that the two agree). Each rank runs grad_accum micro-batches per step.
  std::int64_t world_size = 1;
  // ZeRO stage. 0: plain data parallel (every rank keeps every gradient and all optimizer state). 1: each rank
  // steps, and keeps optimizer state for, only its shard of each parameter (dist::shard_bounds: rows of the
  // flattened tensor, boundaries on the 8-bit block of 256), then the ranks exchange the stepped shards; for
  // the elementwise optimizers with 8-bit blocks of at most 256. Adafactor (on the CPU, without GaLore) shards
  // whole rows and exchanges its row and column statistics (optim::Adafactor::RowShards). With GaLore a projected
  // weight is stepped whole by every rank and only its projected state is sharded (optim::GaLore::StateShards).
  // Checkpoints then hold a file per rank beside the main one, and resume at any world size. At world_size 1
  // there is nothing to shard. 2: each rank also keeps only its shard of the summed gradients (a reduce-scatter
  // per bucket) and clips by a canonical global norm; with fp16 each rank unscales its shards and a step is
  // skipped when any rank saw an overflow. GaLore-projected weights keep their whole summed gradients, as at
  // ZeRO-1 (the projection reads all of it); the other gradients are sharded.
  std::int64_t zero = 0;
  // Pipeline parallelism (train/pipeline.h): the model's blocks cut into pipeline_stages contiguous stages, one
  // per rank of the launcher's group, the grad_accum micro-batches (>= pipeline_stages) flowing through them in
  // pipeline_schedule's order: "1f1b" (warm-up forwards, then one forward / one backward: a stage keeps at most
  // pipeline_stages micro-batches in flight) or "gpipe" (every forward, then every backward: grad_accum in
  // flight). The canonical reduction is on, so the run has the bits of one rank with canonical_reduction. Beside
  // data parallelism world_size such pipelines train on their blocks of the batch (ranks = world_size x
  // pipeline_stages; ZeRO-1 at most), still with those bits. On the CPU over MPI; not yet with ZeRO-2, tensor
  // parallelism, layer-wise updates, LISA, LoRA, bf16 parameters or gradient compression. Each stage writes its
  // own checkpoint files (Trainer::save_checkpoint).
  std::int64_t pipeline_stages = 1;
  std::string pipeline_schedule = "1f1b";
  // Tensor parallelism (train/tensor_parallel.h): every block and the vocabulary split over tensor_parallel
  // ranks of the launcher's group (Megatron-LM's column- and row-parallel layers, a vocabulary-parallel embedding
  // and loss), all ranks of a group training on the same batches. Beside data parallelism world_size such groups
  // train on their blocks of the batch (ranks = world_size x tensor_parallel; ZeRO-1 at most). On the CPU over
  // MPI; not yet beside ZeRO-2, a pipeline, layer-wise updates, LISA, LoRA, GaLore or Adafactor (a part's
  // projection or statistics are not the whole's), fp8, bf16 parameters or gradient compression.
  std::int64_t tensor_parallel = 1;
  // Gradient compression of a data-parallel run: "none", or Deep Gradient Compression (Lin et al. 2018,
  // dist::DgcSync) as "dgc:RATIO[,momentum=M][,warmup=STEPS]": each rank sends only the largest
  // (1 - RATIO) of each tensor's accumulated gradient as (index, value) pairs and keeps the rest for later
  // steps (parse_grad_compression). ZeRO 0 only, on the CPU, not with layer-wise updates or fp16.
  std::string grad_compression = "none";
  // Optimizer offload: "none"; "file:DIR" keeps the optimizer state in memory-mapped files under DIR
  // (core/file_arena.h), stepped a slice at a time, so the process holds only the slice it steps: the same bits
  // as in memory, its peak RSS lower by the state's bytes. DIR must exist and be writable, with room for the
  // state: fit() checks both before its first step, naming the bytes. CPU runs; "host" (a device run's state in
  // host memory) is not built yet.
  std::string offload_optimizer = "none";
  // Sums a step's micro-batch gradients in the canonical tree order (train/gradient_tree.h) instead of adding
  // each into .grad as it comes: costs up to log2(grad_accum) extra gradient sets, and gives the bits of a
  // data-parallel run of the same global batch at any world size. Always on when world_size > 1, where it
  // needs grad_accum to be a power of two (a rank's block must be one subtree of the global tree).
  bool canonical_reduction = false;
  // A fused loss head (GPT's ops::fused_linear_cross_entropy) makes its gradients during the forward, for the
  // backward's seed (micro-batch weight x loss scale) declared by ops::LossGradientSeed, instead of recomputing
  // every logit in the backward: the same bits, a third fewer head FLOPs. false: the recompute, for comparison.
  bool head_gradients_in_forward = true;
  // Under bf16/fp16 autocast the fused head runs its GEMMs in the compute dtype (ops::HeadGemmsInComputeDtype):
  // faster where the backend has narrow GEMMs (bf16 on the CPU). An f32 head weight is cast a block of 4096 rows
  // at a time, so no narrow copy of it is made; the head's workspace holds its dlogits in the compute dtype too.
  // false: f32 GEMMs.
  bool head_gemms_in_compute_dtype = true;
  // Where the model trains (JSON: "cpu", "cuda" = cuda:0, "cuda:N"). The Trainer moves the model there
  // (nn::Module::to) and each batch as it comes; it throws naming CUDA when the device is not usable.
  Device device = Device::cpu();
  // amp/precision.h: fp32, bf16 (bf16 compute and stored activations over f32 master weights), fp16 (the same
  // with dynamic loss scaling, options below), fp8 (bf16, with every linear in FP8: amp/fp8_linear.h).
  amp::Precision precision = amp::Precision::fp32;
  // How trained parameters are stored (amp/precision.h): f32 masters, or bf16 without a master (the optimizer
  // computes in f32 and rounds back: stochastically, seeded by `seed`, or with Kahan compensation). bf16 needs
  // precision bf16 or fp8 (the compute runs on the bf16 weights themselves), one rank, and no LoRA or LISA.
  amp::ParamDtype param_dtype = amp::ParamDtype::f32;
  // With f32 masters under bf16/fp16/fp8 autocast: whether backward casts each weight again when it needs the
  // compute copy (recast: about one layer's copies alive at a time) or keeps the copies from the forward
  // (keep_for_backward: every weight's copy alive until backward reaches it, one cast fewer per weight and step).
  amp::WeightCasts weight_casts = amp::WeightCasts::recast;
  amp::LossScalerOptions loss_scaler;  // fp16 only
  // fp8 only: blockwise (1x128 / 128x128 current scales) or delayed.
  amp::Fp8ScalingKind fp8_scaling = amp::Fp8ScalingKind::blockwise;
  std::int64_t fp8_amax_history = 16;     // fp8 delayed: amax history length per tensor
  std::int64_t fp8_margin = 0;            // fp8 delayed: scales divided by 2^margin
  // The Trainer sets it on the model (nn::Module::set_checkpointing). JSON: ckpt::Policy::parse's forms (none,
  // full, every:K, selective, budget:64MiB).
  ckpt::Policy activation_checkpointing = ckpt::Policy::none();
  // GaLore (optim/galore.h) on the 2-D weights galore_targets chooses when galore_rank > 0; the optimizer
  // above is its base rule (adamw8bit = 8-bit GaLore).
  std::int64_t galore_rank = 0;          // 0 = off
  std::int64_t galore_update_gap = 200;  // steps between projector refreshes
  double galore_scale = 0.25;            // alpha: the projected update is scaled by it
  optim::GaLoreProjType galore_proj_type = optim::GaLoreProjType::std_side;  // JSON: std, reverse_std, left, ...
  optim::GaLoreSvd galore_svd = optim::GaLoreSvd::randomized;                // JSON: randomized, exact
  optim::GaLoreDecayOrder galore_decay_order = optim::GaLoreDecayOrder::before;  // JSON: before, after
  // Which parameters GaLore projects: name globs, '*' matching any run of characters over the whole name
  // ("*.w_in.weight", "mixer.*.weight"); only 2-D parameters are ever chosen (a match of another rank is
  // skipped). Empty: the attention and MLP weights (optim::is_galore_target). Patterns that match nothing
  // make the Trainer refuse, listing the model's 2-D parameters. Kept, unused, while galore_rank is 0.
  std::vector<std::string> galore_targets;
  // Layer-wise updates (Trainer): each parameter is stepped inside its gradient-ready hook during the
  // backward of the step's last micro-batch and its gradient freed at once. Works with grad_accum > 1 (GaLore
  // weights accumulate in the projected space) and with grad_clip (a per-parameter rule, see trainer.h); with
  // the canonical reduction and data parallel (each parameter stepped as its sum over the ranks lands; not
  // with GaLore there).
  bool layerwise_update = false;
  // LoRA (nn/lora.h) when lora.rank > 0: the Trainer adds adapters to the Linears lora.targets chooses before
  // anything else, and freezes the rest of the model. The frozen weights of the adapted layers are stored in
  // the compute dtype under bf16 / fp16 / fp8 (bf16 for fp8): they need no f32 master, and autocast would cast
  // them to it on every forward. The optimizer, GaLore, layer-wise updates, clipping and checkpoints then see
  // only the adapters. JSON: {"rank", "alpha", "dropout", "rslora", "targets"}.
  nn::LoraConfig lora;
  // LISA (train/lisa.h) when lisa_layers > 0: the embeddings, final norm and head always train; of the
  // model's numbered blocks, lisa_layers train at a time, drawn (seeded) every lisa_interval steps, and a
  // block leaving the active set has its optimizer state freed. Not with LoRA, GaLore, data parallel or the
  // canonical reduction.
  std::int64_t lisa_layers = 0;
  std::int64_t lisa_interval = 20;
  std::int64_t max_steps = 100;
  std::int64_t eval_interval = 50;  // 0 = only at the end
  std::int64_t eval_batches = 8;    // val batches of micro_batch samples per evaluation (at most one pass)
  std::int64_t log_interval = 10;   // plain progress line every N steps when stderr is not a terminal
  std::int64_t checkpoint_interval = 0;  // 0 = no periodic checkpoints
  std::string checkpoint_dir;            // required when checkpoint_interval > 0
  std::int64_t keep_checkpoints = 3;     // newest N kept; older ones deleted after a successful write
  // A step whose loss or global gradient norm is not finite is skipped (no parameter moves) at every
  // precision, and no checkpoint is written after it. This many skipped steps in a row stop fit() with an
  // error, the checkpoints of the last good steps kept; 0 = never stop. fp16's loss scaler skips a few steps
  // in a row by design while it backs off from its initial scale (2^16 halves 16 times to reach 1).
  std::int64_t max_bad_steps = 100;
  std::uint64_t seed = 1337;
  std::optional<std::size_t> memory_budget_bytes;  // allocator budget; exceeding it is OutOfBudget
  std::string metrics_path;  // JSONL, one line per optimizer step; empty = none
  std::string summary_path;  // run summary JSON at the end of fit(); empty = none

  std::int64_t effective_batch() const { return micro_batch * grad_accum * world_size; }
  // Throws memtrain::Error("TrainerConfig", ...) naming the field and the reason: sizes and intervals in
  // range, the schedule consistent with max_steps, and options whose feature is not built yet refused.
  void validate() const;
  void validate_pipeline() const;  // validate()'s part for pipeline_stages
  void validate_tensor_parallel() const;  // and for tensor_parallel

  nlohmann::json to_json() const;
  // Unknown keys are an error (a typo must not silently fall back to a default); missing keys keep defaults.
  static TrainerConfig from_json(const nlohmann::json& j);
  void save(const std::string& path) const;  // atomic
  static TrainerConfig load(const std::string& path);
};

// TrainerConfig::grad_compression, parsed. "none" -> ratio 0 (off). "dgc:RATIO" with RATIO in (0, 1): the
// final sparsity (0.999 sends 0.1% of each tensor); "momentum=M" (M in [0, 1), default 0) is the momentum
// correction's m (use it with plain SGD, as the paper does; 0 leaves an Adam-family optimizer's moments alone);
// "warmup=STEPS" (default 0) raises the sparsity through 75%, 93.75%, 98.4375%, 99.6% over the first STEPS
// steps (a quarter each, never above RATIO). Throws memtrain::Error("TrainerConfig", ...) naming the value.
struct GradCompression {
  double ratio = 0.0;  // 0: off
  double momentum = 0.0;
  std::int64_t warmup_steps = 0;
  bool enabled() const { return ratio > 0.0; }
};
GradCompression parse_grad_compression(const std::string& spec);

// TrainerConfig::offload_optimizer's directory: "" for "none", DIR for "file:DIR". Throws
// memtrain::Error("TrainerConfig", ...) naming the value otherwise.
std::string offload_directory(const std::string& spec);

// "cpu", "cuda", "cuda:N", "meta" -> Device; throws memtrain::Error(where, ...) naming the value otherwise.
// Says nothing about whether the device exists (the Trainer checks that when it moves the model).
Device device_from_name(const std::string& name, const char* where = "TrainerConfig");

}  // namespace memtrain::train
