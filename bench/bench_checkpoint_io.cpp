// Checkpoint save and resume of a GPT training run, measured: what a save and a load hold besides the model and
// the optimizer state (the host allocator's byte accounting and the OS's peak RSS), how long each takes, and
// the file's size. A save and a load each run in their own process, so the load's peak RSS is its own:
//
//   ./bench_checkpoint_io --phase save --dir D [--model gpt2-124M] [--optimizer adamw|adamw8bit] [--steps 1]
//   ./bench_checkpoint_io --phase load --dir D [the same --model and --optimizer]
//
// save trains --steps steps (micro-batch 1, a 64-token window of random tokens, f32) so the optimizer state
// exists, then writes D/ckpt_<step>.safetensors through Trainer::save_checkpoint. load builds the same trainer
// (parameters only: no state yet) and resumes from D. Both print the live bytes before and after, the
// allocator's peak during the phase (its growth above the live bytes after it is what the phase held
// besides), VmRSS before and after and the phase's own VmHWM (reset at its start), and the wall seconds; the
// last line is "RESULT ...". Uses only the public Trainer API, so the same file builds against an older
// libmemtrain for a comparison (bench/checkpoint_io_table.sh).
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/data/loader.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/optim/spec.h"
#include "memtrain/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace mt = memtrain;

namespace {

constexpr std::int64_t kWindow = 64;

struct Args {
  std::string phase, dir, model = "gpt2-124M", optimizer = "adamw";
  std::int64_t steps = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--phase") a.phase = v;
    else if (k == "--dir") a.dir = v;
    else if (k == "--model") a.model = v;
    else if (k == "--optimizer") a.optimizer = v;
    else if (k == "--steps") a.steps = std::stoll(v);
    else MT_CHECK(false, "bench_checkpoint_io", "unknown option {} (known: --phase --dir --model --optimizer --steps)", k);
  }
  MT_CHECK(a.phase == "save" || a.phase == "load", "bench_checkpoint_io", "--phase must be save or load, got '{}'",
           a.phase);
  MT_CHECK(!a.dir.empty(), "bench_checkpoint_io", "--dir is required");
  MT_CHECK(a.optimizer == "adamw" || a.optimizer == "adamw8bit", "bench_checkpoint_io",
           "--optimizer {}: expected adamw or adamw8bit", a.optimizer);
  return a;
}

// Random token windows (the values do not matter: the state's size does).
class RandomTokens : public mt::data::Dataset {
 public:
  explicit RandomTokens(std::int64_t vocab) : vocab_(vocab) {}
  std::int64_t size() const override { return 64; }
  mt::data::Batch collate(const std::vector<std::int64_t>& idx) const override {
    const auto b = static_cast<std::int64_t>(idx.size());
    std::vector<std::int64_t> in, tg;
    for (std::int64_t i : idx)
      for (std::int64_t k = 0; k < kWindow; ++k) {
        in.push_back((i * 7919 + k * 104729) % vocab_);
        tg.push_back((i * 7919 + (k + 1) * 104729) % vocab_);
      }
    mt::CategoryGuard category(mt::MemoryCategory::data);
    mt::data::Batch batch;
    batch.inputs = mt::tensor(in, {b, kWindow});
    batch.targets = mt::tensor(tg, {b, kWindow});
    batch.samples = b;
    batch.targets_count = b * kWindow;
    return batch;
  }
  std::string describe() const override { return "random tokens"; }

 private:
  std::int64_t vocab_;
};

double status_mib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return static_cast<double>(std::stoll(line.substr(std::string(field).size()))) / 1024.0;
  return 0.0;
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  mt::nn::GPTConfig gc = mt::nn::GPTConfig::preset(a.model);
  gc.block_size = kWindow;
  gc.dropout = 0.0;
  mt::train::TrainerConfig c;
  c.optimizer = a.optimizer == "adamw" ? mt::optim::Spec::adamw({.lr = 1e-4}) : mt::optim::Spec::adamw8bit({.lr = 1e-4});
  c.micro_batch = 1;
  c.max_steps = a.steps;
  c.eval_interval = 0;
  c.log_interval = 1000;
  c.data.prefetch = 0;
  c.checkpoint_dir = a.dir;
  c.keep_checkpoints = 1;

  mt::manual_seed(1);
  auto gpt = std::make_shared<mt::nn::GPT>(gc);
  mt::train::Trainer trainer(c, gpt, [gpt](const mt::data::Batch& b) { return gpt->loss(b.inputs, b.targets); },
                             std::make_shared<RandomTokens>(gc.vocab_size));
  if (a.phase == "save")
    for (std::int64_t s = 0; s < a.steps; ++s) trainer.train_step();
  mt::train::release_free_heap();  // what training freed goes back to the OS: RSS before is the live data

  mt::Allocator& host = mt::Allocator::get(mt::Device::cpu());
  const std::size_t live_before = host.stats().live_bytes;
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM restarts from VmRSS: the peak is this phase's
  const double rss_before = status_mib("VmRSS:");
  host.reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  std::string path;
  if (a.phase == "save") {
    path = trainer.save_checkpoint();
  } else {
    MT_CHECK(trainer.resume_latest(), "bench_checkpoint_io", "no checkpoint in '{}': run --phase save first", a.dir);
    path = mt::train::latest_checkpoint(a.dir);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const mt::MemoryStats s = host.stats();
  const double rss_after = status_mib("VmRSS:"), hwm = status_mib("VmHWM:");
  const double file_mib = mib(std::filesystem::file_size(path));

  fmt::print("{} {} of {} ({} parameters, {:.1f} MiB optimizer state): {:.1f} MiB file in {:.2f} s\n", a.phase,
             path, a.model, gpt->num_parameters(), mib(trainer.optimizer().state_bytes()), file_mib, seconds);
  fmt::print("  live: {:.1f} MiB before, {:.1f} MiB after, peak {:.1f} MiB (held besides: {:.1f} MiB)\n",
             mib(live_before), mib(s.live_bytes), mib(s.peak_bytes), mib(s.peak_bytes - s.live_bytes));
  fmt::print("  RSS: {:.1f} MiB before, {:.1f} MiB after, peak {:.1f} MiB (above both: {:.1f} MiB)\n", rss_before,
             rss_after, hwm, hwm - std::max(rss_before, rss_after));
  fmt::print("RESULT phase={} model={} optimizer={} file_mib={:.1f} seconds={:.3f} live_before_mib={:.1f} "
             "live_after_mib={:.1f} live_peak_mib={:.1f} rss_before_mib={:.1f} rss_after_mib={:.1f} "
             "rss_peak_mib={:.1f}\n",
             a.phase, a.model, a.optimizer, file_mib, seconds, mib(live_before), mib(s.live_bytes),
             mib(s.peak_bytes), rss_before, rss_after, hwm);
  return 0;
}
