// Trains a GPT language model on a text corpus and ends with a generated sample and the memory report.
//
// With no flags it prepares Debian's fortunes corpus (a byte-level BPE tokenizer and llm.c token shards
// under --data-dir), trains the "mini" GPT with the memory-efficient defaults (8-bit AdamW), evaluates,
// prints a sample and the memory report. Everything a run used is written under --out-dir: config.json
// (rerun it with --config), metrics.jsonl, summary.json and the checkpoints. --device cuda trains on the GPU
// (the model, the optimizer state and the activations live there; batches are copied over as they are used).
//
//   memtrain_train_gpt --help
#include <memtrain/memtrain.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <malloc.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

using namespace memtrain;
namespace fs = std::filesystem;

namespace {

struct Flags {
  std::string config_file, data_dir = "data/fortunes", out_dir = "runs/gpt", init_from, summary_json;
  std::vector<std::string> data, val_data;
  std::optional<std::string> model, optimizer, precision, param_dtype, weight_casts, fp8_scaling, checkpoint, device, fit, memory_timeline, bucket,
      grad_compression, offload_optimizer, fit_offload, pipeline_schedule, galore_targets, lora_targets, save_adapter, load_adapter;
  std::optional<std::int64_t> seq_len, steps, micro_batch, grad_accum, galore_rank, galore_gap, vocab_size, zero,
      pipeline_stages, tensor_parallel, checkpoint_interval, max_bad_steps, lora_rank, lisa_layers, lisa_interval;
  std::optional<double> galore_scale, lora_alpha, lora_dropout;
  std::optional<double> lr;
  std::optional<std::uint64_t> seed;
  std::int64_t sample_tokens = 96;
  bool eval_only = false, resume = false, layerwise = false, plan_only = false, rslora = false,
       canonical_reduction = false;
  std::optional<std::string> quantize_base;
};

// The defaults of a run without --config: small enough for minutes on 2 CPU cores.
train::TrainerConfig default_config() {
  train::TrainerConfig c;
  c.model.preset = "mini";
  c.optimizer = optim::Spec::adamw8bit({.lr = 1e-3, .weight_decay = 0.1});
  c.schedule = {.warmup_steps = 20, .min_lr_ratio = 0.1, .decay = train::LrDecay::cosine};
  c.micro_batch = 16;
  c.max_steps = 400;
  c.eval_interval = 100;
  c.eval_batches = 8;
  c.log_interval = 10;
  c.checkpoint_interval = 200;
  return c;
}

// "a,b,,c" -> {"a", "b", "c"}: a list flag's items (empty ones dropped, so a trailing comma is harmless).
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Flags given on the command line override the config file (or the defaults).
train::TrainerConfig resolve_config(const Flags& f) {
  train::TrainerConfig c = f.config_file.empty() ? default_config() : train::TrainerConfig::load(f.config_file);
  if (f.model) c.model.preset = *f.model;
  if (f.seq_len) c.model.seq_len = *f.seq_len;
  if (!f.init_from.empty()) c.model.init_from = f.init_from;
  if (f.steps) {
    c.max_steps = *f.steps;
    // A short run keeps a proportionate warmup rather than failing validation.
    if (c.schedule.warmup_steps >= c.max_steps) c.schedule.warmup_steps = c.max_steps / 10;
  }
  if (f.micro_batch) c.micro_batch = *f.micro_batch;
  if (f.grad_accum) c.grad_accum = *f.grad_accum;
  if (f.grad_compression) c.grad_compression = *f.grad_compression;
  if (f.offload_optimizer) c.offload_optimizer = *f.offload_optimizer;
  if (f.optimizer || f.lr)
    c.optimizer = optim::spec_from_name(f.optimizer.value_or(std::string(optim::kind_name(c.optimizer.kind))),
                                        f.lr.value_or(c.optimizer.lr), c.optimizer.weight_decay);
  if (f.precision) c.precision = amp::parse_precision(*f.precision);
  if (f.param_dtype) c.param_dtype = amp::parse_param_dtype(*f.param_dtype);
  if (f.weight_casts) c.weight_casts = amp::parse_weight_casts(*f.weight_casts);
  if (f.fp8_scaling) c.fp8_scaling = amp::fp8_scaling_from_name(*f.fp8_scaling);
  if (f.checkpoint) c.activation_checkpointing = ckpt::Policy::parse(*f.checkpoint);
  if (f.galore_rank) c.galore_rank = *f.galore_rank;
  if (f.galore_gap) c.galore_update_gap = *f.galore_gap;
  if (f.galore_scale) c.galore_scale = *f.galore_scale;
  if (f.galore_targets) c.galore_targets = split_commas(*f.galore_targets);
  if (f.layerwise) c.layerwise_update = true;
  if (f.canonical_reduction) c.canonical_reduction = true;
  if (f.lora_rank) c.lora.rank = *f.lora_rank;
  if (f.lora_alpha) c.lora.alpha = *f.lora_alpha;
  if (f.lora_dropout) c.lora.dropout = *f.lora_dropout;
  if (f.lora_targets) c.lora.targets = split_commas(*f.lora_targets);
  if (f.rslora) c.lora.rslora = true;
  if (f.quantize_base) {
    MT_CHECK(*f.quantize_base == "nf4" || *f.quantize_base == "none", "train_gpt",
             "--quantize-base '{}': known are nf4 and none", *f.quantize_base);
    c.lora.quantize_nf4 = *f.quantize_base == "nf4";
  }
  if (f.lisa_layers) c.lisa_layers = *f.lisa_layers;
  if (f.lisa_interval) c.lisa_interval = *f.lisa_interval;
  if (f.seed) c.seed = *f.seed;
  if (f.checkpoint_interval) c.checkpoint_interval = *f.checkpoint_interval;
  if (f.max_bad_steps) c.max_bad_steps = *f.max_bad_steps;
  if (f.device) c.device = train::device_from_name(*f.device, "--device");
  if (c.checkpoint_dir.empty()) c.checkpoint_dir = (fs::path(f.out_dir) / "checkpoints").string();
  if (c.metrics_path.empty()) c.metrics_path = (fs::path(f.out_dir) / "metrics.jsonl").string();
  c.summary_path = !f.summary_json.empty()       ? f.summary_json
                   : c.summary_path.empty() ? (fs::path(f.out_dir) / "summary.json").string()
                                            : c.summary_path;
  c.validate();
  return c;
}

bool is_shard(const std::string& path) { return fs::path(path).extension() == ".bin"; }

// Token shards and the tokenizer that made them: given .bin shards are used as they are (tokenizer.json
// beside them when present); text (a file or a fortunes-style directory, default Debian's fortunes) is
// tokenized into --data-dir once and reused by later runs.
struct Corpus {
  std::vector<std::string> train, val;
  std::optional<data::BpeTokenizer> tokenizer;
};

Corpus prepare_data(const Flags& f, std::int64_t vocab_size) {
  Corpus corpus;
  if (!f.data.empty() && is_shard(f.data.front())) {
    corpus.train = f.data;
    corpus.val = f.val_data.empty() ? f.data : f.val_data;
    const fs::path tok = fs::path(f.data.front()).parent_path() / "tokenizer.json";
    if (fs::exists(tok)) corpus.tokenizer = data::BpeTokenizer::load(tok.string());
    return corpus;
  }
  // A model started from GPT-2's weights needs GPT-2's tokenizer: its files beside the checkpoint become
  // the tokenizer.json that prepare_corpus uses (a separate data dir keeps it apart from trained ones).
  if (!f.init_from.empty()) {
    const fs::path dir = fs::is_directory(f.init_from) ? fs::path(f.init_from) : fs::path(f.init_from).parent_path();
    MT_CHECK(fs::exists(dir / "encoder.json") && fs::exists(dir / "vocab.bpe"), "train_gpt",
             "--init-from {} with text data needs GPT-2's encoder.json and vocab.bpe beside it (or pass .bin shards)",
             f.init_from);
    const auto gpt2 = data::BpeTokenizer::from_gpt2_files((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
    fs::create_directories(f.data_dir);
    gpt2.save((fs::path(f.data_dir) / "tokenizer.json").string());
    vocab_size = gpt2.vocab_size();
  }
  const std::string source = f.data.empty() ? "/usr/share/games/fortunes" : f.data.front();
  const std::vector<std::string> documents = data::read_documents(source);
  fmt::print("data: {} documents from {}\n", documents.size(), source);
  const data::PreparedCorpus prepared =
      data::prepare_corpus(documents, f.data_dir, {.vocab_size = vocab_size, .val_fraction = 0.05, .seed = 1});
  fmt::print("data: {} train / {} val tokens in {} (tokenizer: {} tokens)\n", prepared.train_tokens,
             prepared.val_tokens, f.data_dir, vocab_size);
  corpus.train = prepared.train_shards;
  corpus.val = prepared.val_shards;
  corpus.tokenizer = data::BpeTokenizer::load(prepared.tokenizer_path);
  return corpus;
}

std::shared_ptr<nn::GPT> make_model(const train::TrainerConfig& c, std::int64_t vocab_size, nn::GPTStage stage = {},
                                    nn::TensorShard tensor = {}) {
  if (!c.model.init_from.empty()) {
    MT_CHECK(stage.count == 1 && !tensor.split(), "train_gpt",
             "--init-from with --pipeline-stages or --tensor-parallel: a rank cannot load part of a Hugging Face "
             "checkpoint yet");
    return nn::gpt2_from_pretrained(c.model.init_from);
  }
  nn::GPTConfig g = nn::GPTConfig::preset(c.model.preset);
  g.vocab_size = vocab_size;
  if (c.model.seq_len > 0) g.block_size = c.model.seq_len;
  g.dropout = c.model.dropout;
  manual_seed(c.seed);
  return std::make_shared<nn::GPT>(g, DType::f32, stage, std::move(tensor));
}

// The training and evaluation window: --seq-len when given, else the model's block size. A model from
// --init-from keeps the checkpoint's position table (n_positions) and may use shorter windows, not longer.
std::int64_t window_length(const train::TrainerConfig& c, const nn::GPT& model) {
  const std::int64_t positions = model.config().block_size;
  if (c.model.seq_len == 0) return positions;
  MT_CHECK(c.model.seq_len <= positions, "train_gpt", "--seq-len {} is longer than the model's {} positions{}",
           c.model.seq_len, positions,
           c.model.init_from.empty() ? std::string() : fmt::format(" (n_positions of --init-from {})", c.model.init_from));
  return c.model.seq_len;
}

void print_sample(nn::GPT& model, const data::BpeTokenizer& tokenizer, std::int64_t tokens, std::uint64_t seed) {
  const nn::SampleOptions options{.max_new_tokens = tokens, .temperature = 0.8, .top_k = 40, .seed = seed,
                                  .stop_token = tokenizer.eot_token()};
  // The sampler works on the host: the window goes to the model's device and the logits come back.
  const Device device = model.device();
  const auto forward = [&](const Tensor& idx) { return model.forward(idx.to(device)).to(Device::cpu()); };
  const auto ids = nn::sample_tokens(model, forward,
                                     model.config().block_size, {tokenizer.eot_token()}, options);
  std::vector<std::int32_t> generated(ids.begin() + 1, ids.end());
  if (!generated.empty() && generated.back() == tokenizer.eot_token()) generated.pop_back();
  fmt::print("\n--- sample ({} tokens, temperature 0.8, top-k 40) ---\n{}\n---\n", generated.size(),
             tokenizer.decode(generated));
}

// What train::predict_memory and train::fit_to_budget run: the configured GPT over blank windows of the run's
// shapes (no corpus is read). The vocabulary is `vocab` (the prepared tokenizer's), else --vocab-size or the
// preset's; with --init-from, the checkpoint's config.json (its weights are not loaded, only its shapes matter).
dist::DataParallelOptions dp_options(const Flags& f) {
  dist::DataParallelOptions options;
  if (f.bucket) options.bucket_bytes = parse_byte_size(*f.bucket, "--bucket");
  return options;
}

// The bytes of the token shards the run will map and read whole: those given with --data, or those prepared in
// --data-dir (0 when it is not prepared yet: the prediction then leaves the data out of the peak RSS).
std::size_t prepared_shard_bytes(const Flags& f) {
  std::vector<fs::path> shards;
  if (!f.data.empty() && is_shard(f.data.front())) {
    const std::vector<std::string>& val = f.val_data.empty() ? f.data : f.val_data;  // as prepare_data's
    shards.assign(f.data.begin(), f.data.end());
    shards.insert(shards.end(), val.begin(), val.end());
  } else {
    shards = {fs::path(f.data_dir) / "train_000.bin", fs::path(f.data_dir) / "val_000.bin"};
  }
  std::size_t bytes = 0;
  for (const fs::path& shard : shards) {
    std::error_code ec;
    const auto size = fs::file_size(shard, ec);
    if (!ec) bytes += static_cast<std::size_t>(size);
  }
  return bytes;
}

struct PlanInputs {
  nn::GPTConfig gpt;
  std::int64_t window = 0;
  train::RunInputs inputs;
};

PlanInputs plan_inputs(const Flags& f, const train::TrainerConfig& config, std::optional<std::int64_t> vocab = {}) {
  PlanInputs plan;
  nn::GPTConfig& g = plan.gpt;
  g = nn::GPTConfig::preset(config.model.preset);
  if (!config.model.init_from.empty()) {
    const fs::path from(config.model.init_from);
    g = nn::gpt2_config_from_hf_json(((fs::is_directory(from) ? from : from.parent_path()) / "config.json").string());
  } else if (vocab || f.vocab_size) {
    g.vocab_size = vocab ? *vocab : *f.vocab_size;
  }
  MT_CHECK(config.model.seq_len <= g.block_size || config.model.init_from.empty(), "train_gpt",
           "--seq-len {} is longer than the model's {} positions (n_positions of --init-from {})", config.model.seq_len,
           g.block_size, config.model.init_from);
  if (config.model.seq_len > 0 && config.model.init_from.empty()) g.block_size = config.model.seq_len;
  g.dropout = config.model.dropout;
  plan.window = config.model.seq_len > 0 ? config.model.seq_len : g.block_size;
  // Enough windows for any split of the global batch and for eval_batches.
  const std::int64_t windows = config.micro_batch * config.grad_accum * config.world_size *
                               std::max<std::int64_t>(1, config.eval_batches);
  plan.inputs.make_model = [g, seed = config.seed] {
    manual_seed(seed);
    return std::static_pointer_cast<nn::Module>(std::make_shared<nn::GPT>(g));
  };
  plan.inputs.make_loss = [](const std::shared_ptr<nn::Module>& m) -> train::LossFn {
    auto gpt = std::static_pointer_cast<nn::GPT>(m);
    return [gpt](const data::Batch& b) { return gpt->loss(b.inputs, b.targets); };
  };
  const Shape window{plan.window};
  plan.inputs.train = std::make_shared<data::BlankDataset>(windows, window, DType::i64, window);
  plan.inputs.resident_data_bytes = prepared_shard_bytes(f);
  plan.inputs.val = config.eval_batches > 0 ? plan.inputs.train : nullptr;
  // Under mpirun each process predicts its own rank: its shards and buckets (--fit predicts every rank).
  if (config.world_size > 1) {
    plan.inputs.prepare = dist::simulate_rank(dist::world()->rank(), dp_options(f));
    plan.inputs.prepare_rank = [options = dp_options(f)](std::int64_t r) {
      return dist::simulate_rank(static_cast<int>(r), options);
    };
  }
  return plan;
}

// --plan-only: the configured run on the meta device, printed and, with --summary-json, written under
// "predicted". Nothing is read or trained, and no GPU is needed to plan a --device cuda run.
void plan_only(const Flags& f, const train::TrainerConfig& config, dist::Communicator& world) {
  const PlanInputs plan = plan_inputs(f, config);
  const nn::GPTConfig& g = plan.gpt;
  const train::MemoryPrediction p = train::predict_memory(config, plan.inputs);
  // Under mpirun every rank predicted its own memory; rank 0 speaks for all.
  const std::vector<std::int64_t> peaks = world.all_gather_i64({static_cast<std::int64_t>(p.peak_bytes_total)});
  if (world.rank() != 0) return;
  fmt::print("plan: GPT L{} H{} C{} V{}, windows of {} tokens, micro-batch {} x {}, optimizer {}, precision {}, "
             "parameters {}, checkpointing {}{}\n",
             g.n_layer, g.n_head, g.n_embd, g.vocab_size, plan.window, config.micro_batch, config.grad_accum,
             config.optimizer.to_string(), amp::precision_name(config.precision),
             amp::param_dtype_name(config.param_dtype),
             config.activation_checkpointing.to_string(),
             config.world_size > 1 ? fmt::format(", {} ranks at ZeRO {} (rank 0 below)", config.world_size, config.zero)
                                   : std::string());
  fmt::print("{}", p.report());
  if (config.world_size > 1) fmt::print("predicted peak by rank: {} bytes\n", fmt::join(peaks, ", "));
  if (!f.summary_json.empty()) {
    train::write_prediction(p, config, f.summary_json);
    fmt::print("prediction written to {}\n", f.summary_json);
  }
}

// The --fit budget, after refusing the flags it contradicts (naming both).
std::size_t check_fit_flags(const Flags& f, const train::TrainerConfig& config) {
  const std::size_t budget = parse_byte_size(*f.fit, "--fit");
  MT_CHECK(!f.resume, "--fit", "--fit {} and --resume contradict: a resumed run keeps its checkpoint's configuration",
           *f.fit);
  MT_CHECK(!f.eval_only, "--fit", "--fit {} and --eval-only contradict: an evaluation trains nothing to fit", *f.fit);
  MT_CHECK(!config.memory_budget_bytes || *config.memory_budget_bytes == budget, "--fit",
           "--fit {} and --config's memory_budget_bytes {} contradict: give one budget", *f.fit,
           *config.memory_budget_bytes);
  MT_CHECK(!f.fit_offload || !f.offload_optimizer, "--fit-offload",
           "--fit-offload {} and --offload-optimizer {} contradict: the first lets --fit choose, the second fixes it",
           *f.fit_offload, *f.offload_optimizer);
  return budget;
}

// --fit BUDGET: the fastest configuration whose predicted peak fits (train::fit_to_budget). A knob given on
// the command line stays as given; the global batch (micro-batch x accumulation) stays. Refuses, before any
// step, when nothing fits. Returns the chosen configuration, whose memory_budget_bytes is the budget. Under
// mpirun the budget is each rank's, every rank of each candidate is predicted, and rank 0's cost model is
// everyone's, so all ranks choose the same configuration.
train::TrainerConfig fit_config(const Flags& f, const train::TrainerConfig& config, std::optional<std::int64_t> vocab,
                                dist::Communicator& world) {
  const std::size_t budget = check_fit_flags(f, config);
  train::FitKnobs knobs;
  knobs.precision = !f.precision;
  knobs.optimizer_state = !f.optimizer;
  knobs.galore = !f.galore_rank;
  knobs.checkpointing = !f.checkpoint;
  knobs.accumulation = !(f.micro_batch && f.grad_accum);
  knobs.layerwise = !f.layerwise;
  knobs.zero = !f.zero;
  knobs.param_dtype = !f.param_dtype;
  if (f.fit_offload) knobs.offload_dir = *f.fit_offload;
  train::CostModel cost = train::CostModel::calibrate();
  const std::vector<double> rates = world.all_gather_f64({cost.f32_flops_per_second, cost.narrow_flops_per_second,
                                                          cost.bytes_per_second, cost.communicated_bytes_per_second});
  cost.f32_flops_per_second = rates[0];  // rank 0's
  cost.narrow_flops_per_second = rates[1];
  cost.bytes_per_second = rates[2];
  cost.communicated_bytes_per_second = rates[3];
  const train::FitResult r = train::fit_to_budget(config, budget, plan_inputs(f, config, vocab).inputs, knobs, cost);
  if (world.rank() == 0) fmt::print("{}", r.report());
  MT_CHECK(r.chosen.has_value(), "--fit", "no configuration fits in {} (see above)", *f.fit);
  return *r.chosen;
}

// --memory-timeline FILE.svg: records the device's allocator over the second step (the first when there is one
// step) with the Trainer's phases, and writes it with the meta prediction of that step overlaid.
class MemoryTimelineRecorder {
 public:
  MemoryTimelineRecorder(const Flags& f, const train::TrainerConfig& config, train::Trainer& trainer,
                         std::optional<std::int64_t> vocab)
      : path_(f.memory_timeline.value_or("")), trainer_(trainer), device_(config.device),
        step_(std::min<std::int64_t>(2, config.max_steps)) {
    if (path_.empty()) return;
    train::RunInputs inputs = plan_inputs(f, config, vocab).inputs;
    inputs.warm_up_kernels = false;  // this process trains: a warm-up's bytes would count in its peak
    predicted_ = train::predict_memory(config, inputs, true).timeline;
    if (trainer_.step() + 1 == step_) start();
  }
  void after_step(std::int64_t step) {
    if (path_.empty()) return;
    if (step + 1 == step_) start();
    if (step != step_ || !recording_) return;
    trainer_.mark_phases_on(nullptr);
    recording_->stop();
    train::write_memory_timeline_svg(*recording_, predicted_.get(),
                                     fmt::format("memtrain: live bytes by category over step {}", step), path_);
    fmt::print("memory timeline of step {} written to {}\n", step, path_);
    recording_.reset();
  }

 private:
  void start() {
    recording_ = std::make_unique<train::MemoryTimeline>(device_);
    trainer_.mark_phases_on(recording_.get());
  }
  std::string path_;
  train::Trainer& trainer_;
  Device device_;
  std::int64_t step_;
  std::shared_ptr<const train::MemoryTimeline> predicted_;
  std::unique_ptr<train::MemoryTimeline> recording_;
};

void print_scale_up_hints() {
  fmt::print(
      "To scale up: --model small (or gpt2-124M) --seq-len 256 --steps 5000 --grad-accum 4;\n"
      "a bigger corpus with --data FILE.txt (or llm.c .bin shards); start from OpenAI's weights with\n"
      "--init-from DIR/model.safetensors; compare optimizers with --optimizer adamw|adamw8bit|lion8bit|adafactor\n"
      "and read the optimizer_state line of the memory report.\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT on a text corpus with memtrain (default: Debian's fortunes, the mini model, 8-bit AdamW)"};
  Flags f;
  app.add_option("--config", f.config_file, "TrainerConfig JSON (as written to <out-dir>/config.json); flags override it");
  app.add_option("--data", f.data, "train data: .bin token shards, a text file, or a fortunes-style directory");
  app.add_option("--val-data", f.val_data, "validation .bin shards (text data is split automatically)");
  app.add_option("--data-dir", f.data_dir, "where prepared shards and the tokenizer are kept (use another one with --init-from)")
      ->capture_default_str();
  app.add_option("--out-dir", f.out_dir, "config, metrics, summary and checkpoints")->capture_default_str();
  app.add_option("--model", f.model, "preset: tiny, mini, small, gpt2-124M");
  app.add_option("--seq-len", f.seq_len, "training/eval window (default: the preset's block size; with --init-from its n_positions, "
                 "which it may not exceed)");
  app.add_option("--vocab-size", f.vocab_size, "tokenizer size when preparing text (default: the preset's)");
  app.add_option("--steps", f.steps, "optimizer steps");
  app.add_option("--micro-batch", f.micro_batch, "sequences per micro-batch");
  app.add_option("--grad-accum", f.grad_accum, "micro-batches per optimizer step (per rank under mpirun)");
  app.add_option("--zero", f.zero, "ZeRO stage of a data-parallel run under mpirun (0: plain data parallel, "
                 "1: optimizer state sharded, checkpoints with a file per rank)");
  app.add_option("--pipeline-stages", f.pipeline_stages,
                 "under mpirun: cut the model into this many pipeline stages, one per rank (the launcher's count); "
                 "the --grad-accum micro-batches (at least one per stage) flow through them");
  app.add_option("--tensor-parallel", f.tensor_parallel,
                 "under mpirun: split every block's heads and MLP units, and the vocabulary, over this many ranks "
                 "(the launcher's count; Megatron-style), all training on the same batches");
  app.add_option("--pipeline-schedule", f.pipeline_schedule,
                 "pipeline order: 1f1b (default: at most one micro-batch per stage in flight) or gpipe");
  app.add_option("--bucket", f.bucket, "data parallel: gradient bucket size after the first (default 25MiB; "
                 "smaller buckets start their sums sooner and, with --zero 2, hold fewer whole gradients)");
  app.add_option("--grad-compression", f.grad_compression,
                 "data parallel: none (default) or dgc:RATIO[,momentum=M][,warmup=STEPS], Deep Gradient Compression "
                 "sending only the largest (1 - RATIO) of each gradient tensor per step (e.g. dgc:0.999)");
  app.add_option("--offload-optimizer", f.offload_optimizer,
                 "none (default) or file:DIR: the optimizer state in memory-mapped files under DIR, stepped a slice at "
                 "a time, so the process holds none of it between steps (same results; DIR must exist)");
  app.add_option("--checkpoint-interval", f.checkpoint_interval, "steps between checkpoints (0: none; default 200)");
  app.add_option("--max-bad-steps", f.max_bad_steps,
                 "stop after this many skipped (non-finite) steps in a row, keeping the last good checkpoint "
                 "(0: never; default 100)");
  app.add_option("--lr", f.lr, "peak learning rate");
  app.add_option("--optimizer", f.optimizer, "adamw, adamw8bit, lion, lion8bit, sgd, adafactor");
  app.add_option("--precision", f.precision,
                 "fp32, bf16, fp16 or fp8 (f32 master weights; fp16 with loss scaling; fp8: linears in FP8)");
  app.add_option("--param-dtype", f.param_dtype,
                 "parameter storage: f32 (default, the master weights), bf16 (no master: stochastic rounding; needs "
                 "--precision bf16 or fp8) or bf16-kahan (rounded to nearest with a bf16 compensation)");
  app.add_option("--weight-casts", f.weight_casts,
                 "with f32 weights under --precision bf16/fp16/fp8: recast (default: backward casts each weight again, "
                 "so about one layer's low-precision copies are alive at a time) or keep (the forward's copies stay "
                 "alive until backward: every weight's copy at once, one cast fewer per weight and step)");
  app.add_option("--fp8-scaling", f.fp8_scaling, "with --precision fp8: blockwise (default) or delayed");
  app.add_option("--checkpoint", f.checkpoint,
                 "activation checkpointing: none (default), full, every:K, selective[:op1,op2], budget:SIZE (e.g. 64MiB)");
  app.add_option("--galore-rank", f.galore_rank,
                 "GaLore rank for the attention and MLP weights (0 = off); --optimizer is its base rule");
  app.add_option("--galore-gap", f.galore_gap, "steps between GaLore projector refreshes (200)");
  app.add_option("--galore-scale", f.galore_scale, "GaLore scale alpha of the projected update (0.25)");
  app.add_option("--galore-targets", f.galore_targets,
                 "comma-separated name globs of the weights GaLore projects, '*' matching any run of characters "
                 "(e.g. '*.attn.*.weight,*.mlp.*.weight'); only 2-D parameters are chosen (default: attention and MLP)");
  app.add_option("--lora-rank", f.lora_rank,
                 "LoRA rank r (0 = off): adapters on the chosen linears, the rest of the model frozen");
  app.add_option("--lora-alpha", f.lora_alpha, "LoRA alpha: the update is scaled by alpha / r (default 8)");
  app.add_option("--lora-dropout", f.lora_dropout, "dropout on the LoRA A branch's input (default 0)");
  app.add_option("--lora-targets", f.lora_targets,
                 "comma-separated linears to adapt, by name as PEFT's target_modules (c_attn,c_proj,c_fc) or as "
                 "globs over the whole path ('h.1*.mlp.*'); default every linear in the blocks");
  app.add_flag("--rslora", f.rslora, "scale the LoRA update by alpha / sqrt(r) (rsLoRA)");
  app.add_option("--quantize-base", f.quantize_base,
                 "QLoRA: nf4 stores the adapted layers' frozen weights in NF4 with double-quantised absmax "
                 "(4.127 bits a weight), dequantised tile by tile; none (default) keeps the compute dtype");
  app.add_option("--lisa-layers", f.lisa_layers,
                 "LISA: train this many blocks at a time (with the embeddings and head), drawn every --lisa-interval "
                 "steps; a block leaving the active set frees its optimizer state (0 = off)");
  app.add_option("--lisa-interval", f.lisa_interval, "LISA: steps between draws of the active blocks (default 20)");
  app.add_option("--save-adapter", f.save_adapter,
                 "after training, write the LoRA adapter to DIR in Hugging Face PEFT's layout "
                 "(adapter_model.safetensors + adapter_config.json)");
  app.add_option("--load-adapter", f.load_adapter,
                 "start from the LoRA adapter in DIR (PEFT's layout): its r, alpha, dropout and layers replace the "
                 "--lora-* flags");
  app.add_option("--device", f.device, "cpu (default), cuda or cuda:N (needs a build with CUDA and a GPU)");
  app.add_option("--init-from", f.init_from, "Hugging Face GPT-2 model.safetensors (config.json beside it)");
  app.add_flag("--canonical-reduction", f.canonical_reduction,
               "sum each step's micro-batch gradients in the canonical tree (the bits of a data-parallel or pipeline "
               "run of the same global batch, alone)");
  app.add_flag("--layerwise", f.layerwise,
               "step each parameter during backward and free its gradient at once (gradient peak ~ one layer's)");
  app.add_flag("--eval-only", f.eval_only, "evaluate (and sample) without training; the summary gets the val loss and what it covered");
  app.add_option("--fit", f.fit,
                 "memory budget (e.g. 1.5GiB): choose the fastest precision, parameter dtype, optimizer state, GaLore, "
                 "checkpointing (a budget:SIZE policy included), micro-batch split, layer-wise setting, offload (with "
                 "--fit-offload) and (under mpirun, a budget per rank) ZeRO stage whose predicted peak fits on every "
                 "rank; flags given stay as given");
  app.add_option("--fit-offload", f.fit_offload,
                 "with --fit: the optimizer state may go to files under DIR (as --offload-optimizer file:DIR) when "
                 "that is what fits or is fastest");
  app.add_option("--memory-timeline", f.memory_timeline,
                 "write an SVG of the live bytes by category over the second training step (its eval and checkpoint "
                 "included), phases marked, with the meta prediction of the same step overlaid");
  app.add_flag("--plan-only", f.plan_only,
               "predict the run's memory on the meta device and stop (no data read, nothing trained, no GPU needed); "
               "--summary-json gets it under \"predicted\"");
  app.add_flag("--resume", f.resume, "continue from the newest checkpoint in <out-dir>/checkpoints");
  app.add_option("--summary-json", f.summary_json, "run summary path (default <out-dir>/summary.json)");
  app.add_option("--seed", f.seed, "seed for init, data order and dropout");
  app.add_option("--sample-tokens", f.sample_tokens, "tokens to generate at the end (0 = none)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // Progress and the report go to stderr; line-buffered stdout keeps both in order in a log file.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Past a file-size limit (ulimit -f) a write then fails with EFBIG, which the save reports as it reports a
  // full disk (naming the file and the bytes it needs), instead of the process dying of SIGXFSZ mid-save.
  std::signal(SIGXFSZ, SIG_IGN);

  std::shared_ptr<dist::Communicator> world;  // set first thing in the try: the catch may need it
  try {
    // Under mpirun every process is one data-parallel rank: the launcher sets the world size.
    world = dist::world();
    const bool lead = world->rank() == 0;  // prints, writes the out-dir files and prepares the data
    train::TrainerConfig config = resolve_config(f);
    config.world_size = world->size();
    if (f.zero) config.zero = *f.zero;
    // The launcher's ranks are data x model: one model is held by its pipeline stages, or by its tensor-parallel
    // parts (the flags, or a --config file's), and each data rank's model trains on its block of the batches.
    if (f.pipeline_schedule) config.pipeline_schedule = *f.pipeline_schedule;
    if (f.pipeline_stages) config.pipeline_stages = *f.pipeline_stages;
    if (f.tensor_parallel) config.tensor_parallel = *f.tensor_parallel;
    const bool pipelined = config.pipeline_stages > 1, tensor_split = config.tensor_parallel > 1;
    MT_CHECK(!pipelined || !tensor_split, "train_gpt",
             "--pipeline-stages {} with --tensor-parallel {}: not built yet (one of them, beside data parallelism)",
             config.pipeline_stages, config.tensor_parallel);
    const std::int64_t model_ranks = pipelined ? config.pipeline_stages : config.tensor_parallel;
    dist::DataModelGroups groups{world, world};
    if (model_ranks > 1) {
      MT_CHECK(world->size() % model_ranks == 0, "train_gpt",
               "{} {} under {} ranks: the ranks must be a multiple of it (data x model; launch with mpirun -np {})",
               pipelined ? "--pipeline-stages" : "--tensor-parallel", model_ranks, world->size(), model_ranks);
      groups = dist::split_data_model(world, static_cast<int>(model_ranks));
      config.world_size = groups.data->size();
    }
    MT_CHECK(!pipelined || (!f.plan_only && !f.fit && !f.eval_only), "train_gpt",
             "--pipeline-stages with --plan-only, --fit or --eval-only: not built yet for a pipeline");
    MT_CHECK(!tensor_split || (!f.plan_only && !f.fit && !f.memory_timeline), "train_gpt",
             "--tensor-parallel with --plan-only, --fit or --memory-timeline: not built yet (the prediction has no "
             "tensor-parallel group)");
    // One GPU per rank: a data-parallel --device cuda run puts each rank on cuda:<its local rank>.
    if (config.device.is_cuda() && world->size() > 1) config.device = Device::cuda(world->local_rank());
    config.validate();
    MT_CHECK(!f.fit_offload || f.fit, "--fit-offload", "--fit-offload {} without --fit: give --offload-optimizer "
             "file:{} to put the state in files", *f.fit_offload, *f.fit_offload);
    if (f.fit) (void)check_fit_flags(f, config);  // before any data is prepared
    if (f.plan_only) {
      if (f.fit) config = fit_config(f, config, std::nullopt, *world);
      plan_only(f, config, *world);
      return 0;
    }
    // Before any data is prepared: a run asked for a GPU that is not there stops at once, saying why.
    const Device device = config.device;
    MT_CHECK(device.is_cpu() || cuda::is_available(), "train_gpt", "--device {}: CUDA is not usable here ({})",
             device.str(), cuda::unavailable_reason());
    const std::int64_t vocab = f.vocab_size.value_or(nn::GPTConfig::preset(config.model.preset).vocab_size);
    // Rank 0 tokenizes the corpus; the others then find it prepared and reuse it.
    if (!lead) world->barrier();
    Corpus corpus = prepare_data(f, vocab);
    // The documents read to check (or make) the prepared corpus are freed, but their small blocks stay in the
    // heap's pages: hand those back, so the run does not carry the corpus text through its training.
    ::malloc_trim(0);
    if (lead) world->barrier();
    config.data.train = corpus.train;
    config.data.val = corpus.val;
    if (f.fit) {
      config = fit_config(f, config, corpus.tokenizer ? std::optional(corpus.tokenizer->vocab_size()) : std::nullopt,
                          *world);
    }
    const nn::GPTStage stage =
        pipelined ? nn::GPTStage{groups.model->rank(), groups.model->size()} : nn::GPTStage{};
    const nn::TensorShard tensor = tensor_split ? nn::TensorShard{groups.model->rank(), groups.model->size(),
                                                                  dist::tensor_parallel_group(groups.model)}
                                                : nn::TensorShard{};
    auto model = make_model(config, corpus.tokenizer ? corpus.tokenizer->vocab_size() : vocab, stage, tensor);
    const std::int64_t T = window_length(config, *model);
    fmt::print("model: {} parameters{} (L{} H{} C{} V{} T{}), windows of {} tokens, optimizer {}, device {}\n",
               model->num_parameters(),
               pipelined ? fmt::format(" on stage {} of {} (blocks {}..{})", stage.index, stage.count,
                                       stage.blocks(model->config()).first, stage.blocks(model->config()).second - 1)
               : tensor_split ? fmt::format(" on tensor-parallel rank {} of {}", tensor.rank, tensor.count)
                              : std::string(), model->config().n_layer, model->config().n_head, model->config().n_embd,
               model->config().vocab_size, model->config().block_size, T, config.optimizer.to_string(), device.str());

    auto train_set = std::make_shared<data::TokenWindowDataset>(corpus.train, T, model->config().vocab_size);
    auto val_set = std::make_shared<data::TokenWindowDataset>(corpus.val, T, model->config().vocab_size);
    if (lead) {
      fs::create_directories(f.out_dir);
      config.save((fs::path(f.out_dir) / "config.json").string());
    }

    if (f.load_adapter) {
      MT_CHECK(!f.lora_rank && !f.lora_alpha && !f.lora_targets && !f.rslora, "train_gpt",
               "--load-adapter {} takes r, alpha and the layers from the adapter's config: drop the --lora-* flags",
               *f.load_adapter);
      const bool nf4 = config.lora.quantize_nf4;  // how the base is stored is this run's choice, not the file's
      config.lora = nn::read_lora_adapter_config(*model, *f.load_adapter);
      config.lora.quantize_nf4 = nf4;
      if (f.lora_dropout) config.lora.dropout = *f.lora_dropout;
    }
    MT_CHECK(!f.save_adapter || config.lora.enabled(), "train_gpt",
             "--save-adapter {}: there is no adapter to save (set --lora-rank or --load-adapter)", f.save_adapter.value_or(""));

    auto loss_fn = [model](const data::Batch& b) { return model->loss(b.inputs, b.targets); };
    train::Trainer trainer(config, model, loss_fn, train_set, val_set);
    if (f.load_adapter) {
      nn::load_lora_adapter(*model, *f.load_adapter);
      fmt::print("adapter: {} layers from {}\n", config.lora.targets.size(), *f.load_adapter);
    }
    // Gradients on the GPUs are summed over NCCL (its id broadcast over the MPI world), on the CPU over MPI.
    const std::shared_ptr<dist::Communicator> group =
        device.is_cuda() && world->size() > 1 ? dist::make_nccl_communicator(world) : world;
    // Compressed gradients (Deep Gradient Compression) take the place of the dense sums.
    const bool compressed = train::parse_grad_compression(config.grad_compression).enabled();
    const std::shared_ptr<dist::DgcSync> dgc = compressed ? dist::attach_dgc(trainer, group) : nullptr;
    const std::shared_ptr<dist::DataParallel> data_parallel =
        compressed ? nullptr
                   : dist::attach_data_parallel(trainer, model_ranks > 1 ? groups.data : group, dp_options(f));
    if (pipelined) dist::attach_gpt_pipeline(trainer, model, groups.model);
    if (tensor_split) dist::attach_gpt_tensor_parallel(trainer, model, groups.model);
    // Each rank's optimizer state (ZeRO-1 shards it), gathered after the last step: every rank must take part,
    // and only rank 0 prints the notes.
    auto state_per_rank = std::make_shared<std::string>();
    trainer.memory_notes = [model, data_parallel, dgc, state_per_rank] {
      std::string notes = model->checkpointing().describe(model->config().n_layer);
      if (data_parallel) notes += (notes.empty() ? "" : "\n") + data_parallel->stats().describe();
      notes += *state_per_rank;
      if (dgc) notes += (notes.empty() ? "" : "\n") + dgc->stats().describe();
      return notes;
    };
    if (f.resume && trainer.resume_latest() && lead) fmt::print("resumed at step {}\n", trainer.step());

    auto sample = [&] {
      // The sampler needs whole logits, which neither a pipeline stage nor a tensor-parallel rank has.
      if (lead && !pipelined && !tensor_split && corpus.tokenizer && f.sample_tokens > 0)
        print_sample(*model, *corpus.tokenizer, f.sample_tokens, config.seed);
    };
    if (f.eval_only) {
      // Also written to the summary (--summary-json): the loss and what it was measured over.
      const train::RunSummary summary = trainer.evaluate_and_summarize();
      const train::EvalResult& e = *summary.final_eval;
      fmt::print("val loss {:.4f} over {} windows in {} batches ({} tokens)\n", e.loss, e.samples, e.batches, e.tokens);
      sample();
      fmt::print("\n{}", memory_report());
      if (device.is_cuda()) fmt::print("{}", memory_report(device));
    } else {
      MemoryTimelineRecorder timeline(f, config, trainer, corpus.tokenizer ? std::optional(model->config().vocab_size)
                                                                         : std::nullopt);
      // The sample comes right after the last step, so fit()'s memory report stays the last thing printed.
      trainer.on_step = [&](const train::StepMetrics& m) {
        timeline.after_step(m.step);
        if (m.step != config.max_steps) return;
        if (pipelined || tensor_split) {
          // Every stage's (rank's) own peak and what it holds for good (parameters, activations' peak, optimizer
          // state).
          const MemoryStats mem = Allocator::get(device).stats();
          const std::vector<std::int64_t> all = world->all_gather_i64(
              {static_cast<std::int64_t>(mem.peak_bytes),
               static_cast<std::int64_t>(mem[MemoryCategory::parameters].live_bytes),
               static_cast<std::int64_t>(mem[MemoryCategory::activations].peak_bytes),
               static_cast<std::int64_t>(trainer.optimizer().state_bytes())});
          for (std::size_t r = 0; r < all.size(); r += 4) {
            const auto rank = static_cast<std::int64_t>(r / 4);
            const std::string who = fmt::format("rank {} (data {}, {} {})", rank, rank / model_ranks,
                                                pipelined ? "stage" : "tensor", rank % model_ranks);
            *state_per_rank += fmt::format(
                "\n{}: peak {:.2f} MiB, parameters {:.2f} MiB, activations peak {:.2f} MiB, optimizer state {:.2f} MiB",
                who, all[r] / 1048576.0, all[r + 1] / 1048576.0, all[r + 2] / 1048576.0, all[r + 3] / 1048576.0);
          }
        }
        if (data_parallel) {
          const std::vector<std::int64_t> bytes =
              world->all_gather_i64({static_cast<std::int64_t>(trainer.optimizer().state_bytes())});
          *state_per_rank += fmt::format("\noptimizer state by rank (zero {}): {} bytes", config.zero,
                                        fmt::join(bytes, ", "));
        }
        sample();
        if (lead) print_scale_up_hints();
      };
      trainer.fit();  // ends with the memory report and the run summary (also in <out-dir>/summary.json)
      if (f.save_adapter && lead) {
        nn::save_lora_adapter(*model, config.lora, *f.save_adapter);
        fmt::print("adapter: written to {}\n", *f.save_adapter);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    // The other ranks of a data-parallel run may wait for this one in a collective: end them too.
    if (world && world->size() > 1) dist::abort_world(1);
    return 1;
  }
  return 0;
}
