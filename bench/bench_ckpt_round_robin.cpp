// Checkpointing policies timed round robin: one GPT model, one optimizer, and each round runs one training step
// (forward + fused head loss, backward, AdamW step, zero_grad; f32) under every policy in turn. On a shared
// machine whose speed drifts in phases of seconds, separate processes per policy land in different phases and
// their differences drown in the drift (docs/results/checkpointing.md); here every policy goes through the same
// phases, and the overhead of a policy is the median over rounds of its step time divided by the first
// policy's step time in the same round. The order within a round rotates, so no policy always follows the
// same one.
//
// Run: ./bench_ckpt_round_robin [--model small|gpt2-124M|tiny] [--seq-len T] [--batch B] [--rounds R]
//                               [--warmup W] [--threads P] --checkpoint POLICY [--checkpoint POLICY ...]
// The first --checkpoint is the baseline (usually none). Policies take ckpt::Policy::parse's forms; each keeps
// its own checkpointer, so a budget policy profiles and plans once, in the warm-up rounds. Every policy trains
// the same weights, so the work per step is the same whichever policy ran before. Per policy it prints the
// median wall and CPU step time, the median paired ratio to the baseline, and the peak of the allocator's
// activations category over its timed steps (the forward runs under CategoryGuard(activations), as
// train::Trainer runs it). The last lines are machine-readable ("RESULT ...").
#include "memtrain/autograd/engine.h"
#include "memtrain/ckpt/checkpoint.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/optim/spec.h"
#include "step_timing.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace memtrain;
using bench::cpu_seconds, bench::median_of, bench::mib, bench::peak_rss_kib, bench::random_tokens;

struct Args {
  std::string model = "small";
  std::int64_t seq_len = 256;
  std::int64_t batch = 8;
  int rounds = 8;
  int warmup = 1;
  int threads = 0;  // 0 = OpenMP's default
  std::vector<std::string> policies;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    MT_CHECK(i + 1 < argc, "bench_ckpt_round_robin", "option {} needs a value", k);
    const std::string v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--seq-len") a.seq_len = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--rounds") a.rounds = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--checkpoint") a.policies.push_back(v);
    else MT_CHECK(false, "bench_ckpt_round_robin", "unknown option {} (known: --model --seq-len --batch --rounds "
                  "--warmup --threads --checkpoint)", k);
  }
  MT_CHECK(a.policies.size() >= 2, "bench_ckpt_round_robin",
           "give at least two --checkpoint policies (the first is the baseline), got {}", a.policies.size());
  MT_CHECK(a.rounds >= 1 && a.warmup >= 1 && a.batch >= 1 && a.seq_len >= 1, "bench_ckpt_round_robin",
           "need rounds >= 1, warmup >= 1 (a budget policy plans in it), batch >= 1, seq-len >= 1");
  return a;
}

struct PolicyRun {
  ckpt::BlockCheckpointer checkpointer;
  std::vector<double> wall_ms, cpu_ms;
  std::size_t act_peak = 0, total_peak = 0;
  double recomputed_flops = 0;  // per step (ckpt::Counters): what the re-runs computed again
};

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  if (a.threads > 0) omp_set_num_threads(a.threads);
  nn::GPTConfig cfg = nn::GPTConfig::preset(a.model);
  MT_CHECK(a.seq_len <= cfg.block_size, "bench_ckpt_round_robin", "seq-len {} exceeds block_size {} of {}",
           a.seq_len, cfg.block_size, a.model);
  manual_seed(1337);
  nn::GPT model(cfg);
  auto opt = optim::Spec::adamw({.lr = 3e-4, .weight_decay = 0.1})
                 .make(optim::decay_groups(model.named_parameters(), 3e-4, 0.1));
  std::mt19937_64 gen(42);
  const Tensor idx = random_tokens(a.batch, a.seq_len, cfg.vocab_size, gen);
  const Tensor targets = random_tokens(a.batch, a.seq_len, cfg.vocab_size, gen);

  std::vector<PolicyRun> runs;
  for (const std::string& p : a.policies) {
    PolicyRun& run = runs.emplace_back();
    run.checkpointer.set_policy(ckpt::Policy::parse(p));
  }
  const std::size_t k = runs.size();
  fmt::print("memtrain GPT {} (params {:.2f}M) B={} T={} threads={}, {} policies, {} warm-up + {} timed rounds\n",
             a.model, static_cast<double>(model.num_parameters()) * 1e-6, a.batch, a.seq_len, omp_get_max_threads(),
             k, a.warmup, a.rounds);
  Allocator& allocator = Allocator::get(Device::cpu());

  for (int r = 0; r < a.warmup + a.rounds; ++r) {
    for (std::size_t j = 0; j < k; ++j) {
      PolicyRun& run = runs[(static_cast<std::size_t>(r) + j) % k];
      model.swap_checkpointer(run.checkpointer);  // the policy's checkpointer is the model's for this step
      allocator.reset_peak();
      const double flops0 = ckpt::counters().recomputed_flops;
      const double c0 = cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      Tensor loss;
      {
        CategoryGuard category(MemoryCategory::activations);  // backward's gradients are tagged by the engine
        loss = model.loss(idx, targets);
      }
      autograd::backward({loss}, {full({}, 1.0, loss.dtype())});
      opt->step();
      opt->zero_grad();
      const auto t1 = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double, std::milli>(t1 - t0).count();
      const double dc = 1e3 * (cpu_seconds() - c0);
      const MemoryStats mem = allocator.stats();
      const bool timed = r >= a.warmup;
      if (timed) {
        run.wall_ms.push_back(dt), run.cpu_ms.push_back(dc);
        run.recomputed_flops = ckpt::counters().recomputed_flops - flops0;
        run.act_peak = std::max(run.act_peak, mem[MemoryCategory::activations].peak_bytes);
        run.total_peak = std::max(run.total_peak, mem.peak_bytes);
      }
      fmt::print("  round {:2d}{} {:<56} {:9.1f} ms (cpu {:9.1f} ms) loss {:.4f}\n", r, timed ? "" : "w",
                 model.checkpointing().policy().to_string(), dt, dc, loss.item());
      std::fflush(stdout);
      model.swap_checkpointer(run.checkpointer);  // and back: the model keeps the default one between steps
    }
  }

  const PolicyRun& base = runs.front();
  for (std::size_t i = 0; i < k; ++i) {
    const PolicyRun& run = runs[i];
    std::vector<double> ratio;
    for (std::size_t r = 0; r < run.wall_ms.size(); ++r) ratio.push_back(run.wall_ms[r] / base.wall_ms[r]);
    const double lo = *std::min_element(ratio.begin(), ratio.end());
    const double hi = *std::max_element(ratio.begin(), ratio.end());
    fmt::print("{}\n", run.checkpointer.describe(cfg.n_layer));
    fmt::print("RESULT impl=memtrain mode=round_robin model={} B={} T={} threads={} rounds={} policy={} "
               "step_ms={:.1f} cpu_ms={:.1f} overhead_median={:+.4f} overhead_min={:+.4f} overhead_max={:+.4f} "
               "act_peak_bytes={} total_peak_bytes={} act_cut={:.4f} plan_kept_bytes={} recomputed_gflop={:.2f}\n",
               a.model, a.batch, a.seq_len, omp_get_max_threads(), a.rounds, run.checkpointer.policy().to_string(),
               median_of(run.wall_ms), median_of(run.cpu_ms), median_of(ratio) - 1.0, lo - 1.0, hi - 1.0,
               run.act_peak, run.total_peak,
               1.0 - static_cast<double>(run.act_peak) / static_cast<double>(base.act_peak),
               run.checkpointer.plan() ? run.checkpointer.plan()->kept_bytes : std::size_t{0},
               run.recomputed_flops * 1e-9);
  }
  fmt::print("peak RSS {:.0f} MiB (the process, all policies)\n", static_cast<double>(peak_rss_kib()) / 1024.0);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());  // memtrain::Error names the op already
  return 1;
}
