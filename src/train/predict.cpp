// predict_memory (memtrain/train/predict.h): the configured Trainer on the meta device, and its allocator's
// accounting read back as the prediction.
#include "memtrain/train/predict.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/file_arena.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/state_arena.h"
#include "core/backend.h"
#include "core/work_counter.h"
#include "io/atomic_file.h"
#include "train/kernel_warm_up.h"
#include "train/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace memtrain::train {

namespace {

// Bytes of one batch of `size` samples of `dataset`, as the loader would collate it.
std::size_t batch_bytes(const data::Dataset& dataset, std::int64_t size) {
  std::vector<std::int64_t> indices;
  for (std::int64_t i = 0; i < std::min(size, dataset.size()); ++i) indices.push_back(i);
  const data::Batch b = dataset.collate(indices);
  return b.inputs.nbytes() + b.targets.nbytes();
}

// The length of a 1-D sample (a window of tokens); 0 for any other shape.
std::int64_t sample_length(const data::Dataset& dataset) {
  if (dataset.size() == 0) return 0;  // the Trainer refuses it, naming it
  const data::Batch b = dataset.collate({0});
  return b.inputs.dim() == 2 ? b.inputs.size(1) : 0;
}

// The state bytes a step maps from files (optimizer offload), by how FileArena maps their tensors.
void count_offloaded_state(const optim::Optimizer& optimizer, StepWork& work) {
  for (const auto& [name, t] : optimizer.state_view()) {
    if (!in_state_arena(t)) continue;
    (t.nbytes() >= FileArena::kHugeMappingBytes ? work.offloaded_huge_bytes : work.offloaded_small_bytes) +=
        static_cast<double>(t.nbytes());
  }
}

}  // namespace

MemoryPrediction predict_memory(const TrainerConfig& config, const RunInputs& inputs, bool record_timeline) {
  const char* where = "predict_memory";
  MT_CHECK(static_cast<bool>(inputs.make_model), where, "RunInputs::make_model is empty");
  MT_CHECK(static_cast<bool>(inputs.make_loss), where, "RunInputs::make_loss is empty");
  MT_CHECK(inputs.train != nullptr, where, "RunInputs::train is null");
  config.validate();
  MT_CHECK(!parse_grad_compression(config.grad_compression).enabled(), where,
           "grad_compression '{}' is not predicted (its residuals, two copies of every gradient, are not simulated); "
           "predict the run with grad_compression \"none\" and add 8 bytes per parameter",
           config.grad_compression);
  MT_CHECK(config.world_size == 1 || inputs.prepare, where,
           "config.world_size is {}: a data-parallel run is predicted one rank at a time; set RunInputs::prepare "
           "to dist::simulate_rank(r) for rank r", config.world_size);
  const auto t0 = std::chrono::steady_clock::now();
  MemoryPrediction p;
  if (inputs.warm_up_kernels && config.device == Device::cpu() &&
      !detail::warm_up_cpu_kernels(config, sample_length(*inputs.train), p.rss_note)) {
    p.rss_note = "the kernels were not warmed up before the baseline RSS was read: " + p.rss_note;
  }
  const std::size_t rss_before = current_rss_bytes();
  // Building the model draws its initial weights: the caller's stream must not move.
  RngStateGuard rng;

  TrainerConfig meta_config = config;
  meta_config.device = Device::meta();
  meta_config.memory_budget_bytes.reset();
  meta_config.metrics_path.clear();
  meta_config.summary_path.clear();

  Allocator& meta = Allocator::get(Device::meta());
  meta.empty_cache();  // a cache left by an earlier prediction would lend blocks this run would have reserved
  // The meta allocator caches as the predicted device's allocator does: in the CPU's size classes, or carving
  // 2 MiB-granular segments as a CUDA device's does, so the reserved bytes are that allocator's.
  const CachePolicyGuard device_policy(meta, ::memtrain::detail::cache_policy_for(config.device));
  const MemoryStats before = meta.stats();

  p.device = config.device.str();
  {
    std::shared_ptr<nn::Module> model;
    {
      nn::ParameterDeviceGuard on_meta(Device::meta());  // no host memory or time spent on the weights
      model = inputs.make_model();
    }
    LossFn loss = inputs.make_loss(model);
    Trainer trainer(meta_config, std::move(model), std::move(loss), inputs.train, inputs.val);  // peak reset here
    if (inputs.prepare) inputs.prepare(trainer);
    trainer.train_step();  // makes the optimizer state
    std::shared_ptr<MemoryTimeline> timeline;
    if (record_timeline) {
      timeline = std::make_shared<MemoryTimeline>(Device::meta());
      trainer.mark_phases_on(timeline.get());
    }
    {
      // The steady-state step, with its work counted.
      ::memtrain::detail::WorkCounts work;
      ::memtrain::detail::WorkCounterGuard counting(&work);
      const std::size_t allocated = meta.stats().allocated_bytes;
      trainer.train_step();
      p.step_work = {work.flops_f32, work.flops_narrow,
                     static_cast<double>(meta.stats().allocated_bytes - allocated), work.optimizer_bytes,
                     work.communicated_bytes};
      count_offloaded_state(trainer.optimizer(), p.step_work);
    }
    p.steps = 2;
    if (inputs.val) {
      trainer.evaluate();
      p.evaluated = true;
    }
    if (timeline) {
      trainer.mark_phases_on(nullptr);
      timeline->stop();
      p.timeline = timeline;
    }
    const MemoryStats after = meta.stats();
    p.peak_bytes_total = after.peak_bytes - before.live_bytes;
    for (int i = 0; i < kNumMemoryCategories; ++i) {
      const std::string name(category_name(static_cast<MemoryCategory>(i)));
      p.peak_bytes_by_category[name] = after.by_category[i].at_total_peak - before.by_category[i].live_bytes;
      p.category_peak_bytes[name] = after.by_category[i].peak_bytes - before.by_category[i].live_bytes;
    }
    p.reserved_bytes = after.reserved_bytes - before.reserved_bytes;
  }

  // A CPU run's loaders hold up to `prefetch` collated batches each on the host, beside the ones a step holds.
  if (config.device.is_cpu() && config.data.prefetch > 0) {
    std::size_t queued = batch_bytes(*inputs.train, config.micro_batch);
    if (inputs.val) queued += batch_bytes(*inputs.val, config.micro_batch);
    p.host_data_bytes = queued * static_cast<std::size_t>(config.data.prefetch);
    const std::string data(category_name(MemoryCategory::data));
    p.peak_bytes_total += p.host_data_bytes;
    p.peak_bytes_by_category[data] += p.host_data_bytes;
    p.category_peak_bytes[data] += p.host_data_bytes;
    p.reserved_bytes += p.host_data_bytes;
  }
  p.resident_data_bytes = inputs.resident_data_bytes;
  p.peak_rss_bytes =
      rss_before + p.resident_data_bytes + (config.device.is_cpu() ? p.reserved_bytes : p.host_data_bytes);
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

nlohmann::json MemoryPrediction::to_json() const {
  nlohmann::json j = {
      {"device", device},
      {"peak_bytes_total", peak_bytes_total},
      {"peak_bytes_by_category", peak_bytes_by_category},
      {"category_peak_bytes", category_peak_bytes},
      {"reserved_bytes", reserved_bytes},
      {"host_data_bytes", host_data_bytes},
      {"resident_data_bytes", resident_data_bytes},
      {"peak_rss_bytes", peak_rss_bytes},
      {"steps", steps},
      {"evaluated", evaluated},
      {"seconds", seconds},
  };
  if (!rss_note.empty()) j["rss_note"] = rss_note;
  return j;
}

void write_prediction(const MemoryPrediction& prediction, const TrainerConfig& config, const std::string& path) {
  const nlohmann::json j = {{"config", config.to_json()}, {"predicted", prediction.to_json()}};
  const std::string text = j.dump(2) + "\n";
  ::memtrain::detail::AtomicFileWriter out(path, "write_prediction");
  out.write(text.data(), text.size());
  out.commit();
}

std::string MemoryPrediction::report() const {
  std::string out = fmt::format("predicted memory on {} ({} steps{} on meta, {:.2f} s): peak {}, reserved {}, "
                                "process peak RSS about {}\n",
                                device, steps, evaluated ? " and an evaluation" : "", seconds,
                                detail::format_bytes(peak_bytes_total), detail::format_bytes(reserved_bytes),
                                detail::format_bytes(peak_rss_bytes));
  if (!rss_note.empty()) out += fmt::format("  ({})\n", rss_note);
  out += fmt::format("  {:<16} {:>12} {:>12}\n", "category", "at peak", "own peak");
  for (const auto& [name, bytes] : peak_bytes_by_category) {
    const std::size_t own = category_peak_bytes.at(name);
    if (bytes == 0 && own == 0) continue;
    out += fmt::format("  {:<16} {:>12} {:>12}\n", name, detail::format_bytes(bytes), detail::format_bytes(own));
  }
  return out;
}

}  // namespace memtrain::train
