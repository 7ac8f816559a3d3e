// Predicting a run's memory before it starts. predict_memory() runs the configured training on the meta
// device (core/backend.h): the same Trainer, model, optimizer, precision and checkpoint policy, every op
// allocating what it allocates on the CPU, but no kernel and no data. What it runs is what fit() spends its
// peak on: the first optimizer step (the optimizer state is made), a steady-state step, and an evaluation
// when there is a val set. The allocator's byte accounting on meta is the prediction: per category, the total
// peak with what each category held at that moment, and the bytes the allocator's cache reserves.
//
// On the CPU a run's data loaders keep batches in flight on the host (config.data.prefetch per loader); the
// meta run sees only the batches a step holds, so for a CPU run the prediction adds the loaders' queues (one
// train and one val batch per prefetch slot). A CUDA run keeps those on the host, outside the device's peak.
//
// Not predicted: the checkpoint save (on the CPU it writes from the tensors in place, so it adds only the step
// counts; on CUDA it copies one tensor at a time to the host), and what CUDA's own entries allocate differently
// from the CPU's (the meta kernels allocate what the CPU's do). The allocator's reserved bytes are simulated for
// the predicted device: the meta allocator caches in the CPU's size classes for a CPU run and carves 2 MiB
// segments for a CUDA run (Allocator::set_cache_policy), as that device's allocator does; one stream is
// simulated. The peak RSS is an estimate (see MemoryPrediction): for a CPU
// run the prediction first warms up the kernels (RunInputs::warm_up_kernels) so that the process's baseline
// holds what a step's code and runtime bring in.
#pragma once

#include "memtrain/data/loader.h"
#include "memtrain/nn/module.h"
#include "memtrain/train/timeline.h"
#include "memtrain/train/trainer.h"
#include "memtrain/train/trainer_config.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace memtrain::train {

// What the steady-state (second) step does, counted on meta where its kernels would run: the input of the
// fitter's cost model (train/fit.h).
struct StepWork {
  double flops_f32 = 0.0;        // matmul-family products in f32 (fp8's emulated GEMMs included)
  double flops_narrow = 0.0;     // ... in bf16 or f16
  double allocated_bytes = 0.0;  // bytes the step's tensors asked for: what it writes, roughly
  double optimizer_bytes = 0.0;  // bytes the optimizer step reads and writes
  double communicated_bytes = 0.0;  // data parallel: bytes this rank's collectives send to the others
  // Optimizer offload: state bytes in files, in tensors mapped 4 KiB at a time and in 2 MiB folios
  // (FileArena::kHugeMappingBytes and over).
  double offloaded_small_bytes = 0.0;
  double offloaded_huge_bytes = 0.0;
};

struct MemoryPrediction {
  std::string device;                // the device the configuration trains on (config.device)
  std::size_t peak_bytes_total = 0;  // predicted RunSummary::peak_bytes_total
  std::map<std::string, std::size_t> peak_bytes_by_category;  // what each category held at that peak
  std::map<std::string, std::size_t> category_peak_bytes;     // each category's own peak
  std::size_t reserved_bytes = 0;  // the allocator's reserved bytes at the end: live blocks + its cache
  std::size_t host_data_bytes = 0;  // of the above, the CPU loaders' queued batches (CPU runs only)
  std::size_t resident_data_bytes = 0;  // RunInputs::resident_data_bytes
  // The process's peak RSS: its resident set when the prediction started (the library, the program, what it
  // loaded; for a CPU run after the kernel warm-up) plus what the run adds to it: the resident data, and for
  // a CPU run the allocator's reserved bytes, for a CUDA run the loaders' host batches (the CUDA runtime's own
  // host memory is not predicted). An estimate: malloc's own overhead is not counted.
  std::size_t peak_rss_bytes = 0;
  // Why the kernels were not warmed up before the baseline was read (empty: they were, or need not be).
  std::string rss_note;
  std::int64_t steps = 0;           // optimizer steps run on meta
  bool evaluated = false;           // whether an evaluation ran (a val set was given)
  double seconds = 0.0;             // wall time the prediction took
  StepWork step_work;               // the steady-state step's work (not in to_json)
  // With record_timeline: the steady-state step and the evaluation on meta, phases marked (not in to_json).
  std::shared_ptr<const MemoryTimeline> timeline;
  // {"device", "peak_bytes_total", "peak_bytes_by_category": {name: bytes}, "category_peak_bytes": {...},
  //  "reserved_bytes", "host_data_bytes", "resident_data_bytes", "peak_rss_bytes", "rss_note" (when not empty),
  //  "steps", "evaluated", "seconds"}: a run summary's "predicted".
  nlohmann::json to_json() const;
  // Lines for a terminal: the total, then each category at the peak and its own peak.
  std::string report() const;
};

// What a Trainer is given, with the model as a factory: the prediction builds its own copy, on meta
// (nn::ParameterDeviceGuard: parameters a module makes are meta from the start), and discards it. make_loss
// gets that model. Datasets are only collated (their
// batches copied to meta), so data::BlankDataset of the real sample shapes predicts as well as the real data.
struct RunInputs {
  std::function<std::shared_ptr<nn::Module>()> make_model;
  std::function<LossFn(const std::shared_ptr<nn::Module>&)> make_loss;
  std::shared_ptr<const data::Dataset> train;
  std::shared_ptr<const data::Dataset> val;  // may be null: no evaluation
  // Called on the meta Trainer before it runs. A data-parallel config (world_size > 1) needs one that attaches
  // a rank, dist::simulate_rank(r): the prediction is then rank r's memory (its buckets and shards included).
  std::function<void(Trainer&)> prepare;
  // For fit_to_budget at world_size > 1: rank r's `prepare` (dist::simulate_rank(r, options)), so that every
  // rank of every candidate is predicted.
  std::function<std::function<void(Trainer&)>(std::int64_t rank)> prepare_rank;
  // Bytes of data the run's process holds that the prediction does not load: token shards it maps and reads
  // whole, or a data set it reads into memory (for which a data::BlankDataset stands in). Added to the predicted
  // peak RSS.
  std::size_t resident_data_bytes = 0;
  // Whether a CPU prediction first trains a small model for two steps on the CPU under the configuration's
  // settings (train/kernel_warm_up.h), so that its baseline RSS holds the code and runtime a step brings in.
  // false in a process that is training already: its kernels are warm, and the warm-up's bytes would count in its
  // CPU allocator's peak.
  bool warm_up_kernels = true;
};

// Runs `config` on the meta device and returns what it allocates (see above). config.device says which
// device the prediction is for; config.memory_budget_bytes is ignored (the prediction says whether it fits).
// The default RNG stream is left as it was. Throws what the Trainer throws for a bad configuration.
MemoryPrediction predict_memory(const TrainerConfig& config, const RunInputs& inputs, bool record_timeline = false);

// Writes {"config": config.to_json(), "predicted": prediction.to_json()} to path atomically: the shape of a
// run summary, so the prediction and a run's measured "peak_bytes_total" compare key for key.
void write_prediction(const MemoryPrediction& prediction, const TrainerConfig& config, const std::string& path);

}  // namespace memtrain::train
