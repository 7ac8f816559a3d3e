// End-to-end GPT training step, on the CPU or a CUDA device: forward + cross entropy, backward, optimizer step,
// zero_grad.
// The peer program bench/torch_peer/gpt_step_torch.cpp runs the same model and loop in libtorch and
// prints the same lines, so bench/run_gpt_side_by_side.sh can put the two side by side.
//
// Run: ./bench_gpt_e2e [--model small|gpt2-124M|tiny] [--seq-len T] [--batch B] [--steps N] [--warmup W]
//                      [--threads P] [--checkpoint none|full|every:K|selective|budget:SIZE]
//                      [--precision fp32|bf16|fp16|fp8] [--fp8-scaling blockwise|delayed]
//                      [--device cpu|cuda|cuda:N] [--optimizer adamw|adamw8bit] [--galore-rank R]
//                      [--galore-gap N] [--head-grads forward|recompute] [--head-gemm f32|compute]
//                      [--reserve-limit R|none] [--reserve-slack MIB|none] [--release-heap yes|no]
//                      [--weight-casts recast|keep]
// Prints the median step time over N timed steps (after W warm-up steps), tokens/s, peak RSS (VmHWM) and
// memtrain's allocator peaks over the timed steps: all categories, and activations alone (the forward runs
// under CategoryGuard(activations), as train::Trainer runs it, so that category is what the forward allocated
// and is still alive, plus what checkpointed regions recompute during backward). --checkpoint sets the
// model's ckpt::Policy; a budget policy plans on the first forward, so with W = 0 the first timed step is
// its profiling step. A plain main(), not google-benchmark: one step takes seconds, and the median over a
// few steps is what we compare. --precision runs the forward under amp::Autocast as train::Trainer does
// (fp16: backward seeded with a dynamic loss scale, gradients unscaled before the step, overflowing steps
// skipped; fp8: every linear in FP8, delayed scales updated after each step); weights and AdamW state stay f32.
// --device cuda moves the model (nn::Module::to) and the batch to the GPU; each step ends with a device
// synchronize, so the step time is the device's, and the peaks are the device allocator's (the host's peak is
// printed beside them). --optimizer adamw8bit keeps 8-bit moments; --galore-rank R > 0 steps the attention and
// MLP weights in GaLore's rank-R space (as train::Trainer builds it, base rule --optimizer). --head-grads
// forward (the default, as train::Trainer runs) declares the backward's seed (ops::LossGradientSeed) so the
// fused LM head makes its gradients in the forward; recompute leaves it undeclared, and the head's backward
// recomputes the logits. --head-gemm compute (the default, as train::Trainer runs) runs the head's GEMMs in the
// autocast dtype (ops::HeadGemmsInComputeDtype; TrainerConfig.head_gemms_in_compute_dtype); f32 keeps them in
// f32. --reserve-limit sets the device
// allocator's Allocator::set_reserve_limit ratio (none: the cache keeps every freed block; default: the allocator's;
// a ratio keeps the allocator's byte cap above the peak), --reserve-slack that cap (MiB above the live peak, or none),
// and the peak reserved bytes are printed beside the live peak. --release-heap no skips the
// train::release_free_heap() that train::Trainer (and this bench, by default) calls before each step.
// --weight-casts: amp::WeightCasts under --precision bf16/fp16/fp8 (default recast, as train::Trainer).
// The last line is machine-readable ("RESULT ...").
#include "memtrain/amp/autocast.h"
#include "memtrain/amp/fp8_state.h"
#include "memtrain/amp/loss_scaler.h"
#include "memtrain/amp/precision.h"
#include "memtrain/autograd/engine.h"
#include "memtrain/ckpt/policy.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/ops/fused_loss.h"
#include "memtrain/optim/galore.h"
#include "memtrain/optim/spec.h"
#include "memtrain/train/trainer.h"
#include "step_timing.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
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
  int steps = 10;
  int warmup = 3;
  int threads = 0;  // 0 = OpenMP's default
  std::string checkpoint = "none";  // ckpt::Policy::parse's forms
  std::string precision = "fp32";
  std::string fp8_scaling = "blockwise";
  std::string device = "cpu";
  std::string optimizer = "adamw";
  std::int64_t galore_rank = 0;
  std::int64_t galore_gap = 200;
  std::string head_grads = "forward";
  std::string head_gemm = "compute";  // as train::Trainer runs
  std::string reserve_limit;  // empty: the allocator's default
  std::string reserve_slack;  // empty: the allocator's default
  std::string release_heap = "yes";
  std::string weight_casts = "recast";
};

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  MT_CHECK(name.rfind("cuda:", 0) == 0 && name.size() > 5 &&
               name.find_first_not_of("0123456789", 5) == std::string::npos && name.size() <= 8,
           "bench_gpt_e2e", "--device {}: expected cpu, cuda or cuda:N", name);
  return Device::cuda(std::stoi(name.substr(5)));
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    MT_CHECK(i + 1 < argc, "bench_gpt_e2e", "option {} needs a value", k);
    const std::string v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--seq-len") a.seq_len = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--checkpoint") a.checkpoint = v;
    else if (k == "--precision") a.precision = v;
    else if (k == "--fp8-scaling") a.fp8_scaling = v;
    else if (k == "--device") a.device = v;
    else if (k == "--optimizer") a.optimizer = v;
    else if (k == "--galore-rank") a.galore_rank = std::stoll(v);
    else if (k == "--galore-gap") a.galore_gap = std::stoll(v);
    else if (k == "--head-grads") a.head_grads = v;
    else if (k == "--head-gemm") a.head_gemm = v;
    else if (k == "--reserve-limit") a.reserve_limit = v;
    else if (k == "--reserve-slack") a.reserve_slack = v;
    else if (k == "--release-heap") a.release_heap = v;
    else if (k == "--weight-casts") a.weight_casts = v;
    else MT_CHECK(false, "bench_gpt_e2e", "unknown option {} (known: --model --seq-len --batch --steps --warmup "
                  "--threads --checkpoint --precision --fp8-scaling --device --optimizer --galore-rank "
                  "--galore-gap --head-grads --head-gemm --reserve-limit --reserve-slack --release-heap "
                  "--weight-casts)", k);
  }
  MT_CHECK(a.steps >= 1 && a.warmup >= 0 && a.batch >= 1 && a.seq_len >= 1, "bench_gpt_e2e",
           "need steps >= 1, warmup >= 0, batch >= 1, seq-len >= 1");
  MT_CHECK(a.optimizer == "adamw" || a.optimizer == "adamw8bit", "bench_gpt_e2e",
           "--optimizer {}: expected adamw or adamw8bit", a.optimizer);
  MT_CHECK(a.head_grads == "forward" || a.head_grads == "recompute", "bench_gpt_e2e",
           "--head-grads {}: expected forward or recompute", a.head_grads);
  MT_CHECK(a.head_gemm == "f32" || a.head_gemm == "compute", "bench_gpt_e2e",
           "--head-gemm {}: expected f32 or compute", a.head_gemm);
  MT_CHECK(a.galore_rank >= 0 && a.galore_gap >= 1, "bench_gpt_e2e", "need galore-rank >= 0 and galore-gap >= 1");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  if (a.threads > 0) omp_set_num_threads(a.threads);
  nn::GPTConfig cfg = nn::GPTConfig::preset(a.model);
  MT_CHECK(a.seq_len <= cfg.block_size, "bench_gpt_e2e", "seq-len {} exceeds block_size {} of {}", a.seq_len,
           cfg.block_size, a.model);
  const Device device = parse_device(a.device);
  MT_CHECK(device.is_cpu() || cuda::is_available(), "bench_gpt_e2e", "--device {}: CUDA is not usable here ({})",
           a.device, cuda::unavailable_reason());
  manual_seed(1337);
  nn::GPT model(cfg);
  model.to(device);  // before the optimizer, so its state is made on the device
  model.set_checkpointing(ckpt::Policy::parse(a.checkpoint));
  const optim::Spec spec = a.optimizer == "adamw8bit" ? optim::Spec::adamw8bit({.lr = 3e-4, .weight_decay = 0.1})
                                                      : optim::Spec::adamw({.lr = 3e-4, .weight_decay = 0.1});
  std::unique_ptr<optim::Optimizer> opt;
  if (a.galore_rank > 0) {
    optim::GaLoreSpec g;
    g.rank = a.galore_rank;
    g.update_gap = a.galore_gap;
    opt = std::make_unique<optim::GaLore>(spec, g, optim::galore_groups(model.named_parameters(), 3e-4, 0.1));
  } else {
    opt = spec.make(optim::decay_groups(model.named_parameters(), 3e-4, 0.1));
  }

  std::mt19937_64 gen(42);
  const Tensor idx = random_tokens(a.batch, a.seq_len, cfg.vocab_size, gen).to(device);
  const Tensor targets = random_tokens(a.batch, a.seq_len, cfg.vocab_size, gen).to(device);

  const amp::Precision precision = amp::parse_precision(a.precision);
  std::optional<amp::Fp8State> fp8;
  if (precision == amp::Precision::fp8) fp8.emplace(amp::Fp8Recipe{.kind = amp::fp8_scaling_from_name(a.fp8_scaling), .delayed = {}});
  const amp::AutocastMode mode{amp::activation_dtype(precision), fp8 ? &*fp8 : nullptr,
                               amp::parse_weight_casts(a.weight_casts)};
  std::optional<amp::DynamicLossScaler> scaler;
  if (precision == amp::Precision::fp16) scaler.emplace();
  std::vector<Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params.push_back(p);
  int skipped = 0;
  fmt::print("memtrain GPT {} (params {:.2f}M) B={} T={} threads={} checkpoint={} precision={} device={} "
             "optimizer={}{}\n", a.model, static_cast<double>(model.num_parameters()) * 1e-6, a.batch, a.seq_len,
             omp_get_max_threads(), model.checkpointing().policy().to_string(), a.precision, device.str(),
             opt->name(), a.galore_rank > 0 ? fmt::format(" (rank {})", a.galore_rank) : std::string());
  Allocator& allocator = Allocator::get(device);
  Allocator& host = Allocator::get(Device::cpu());
  if (a.reserve_limit == "none") allocator.set_reserve_limit(std::nullopt);
  else if (!a.reserve_limit.empty()) allocator.set_reserve_limit(std::stod(a.reserve_limit), allocator.reserve_slack());
  if (a.reserve_slack == "none") {
    allocator.set_reserve_limit(allocator.reserve_limit(), std::nullopt);
  } else if (!a.reserve_slack.empty()) {
    allocator.set_reserve_limit(allocator.reserve_limit(), static_cast<std::size_t>(std::stoll(a.reserve_slack)) << 20);
  }
  MT_CHECK(a.release_heap == "yes" || a.release_heap == "no", "bench_gpt_e2e", "--release-heap {}: expected yes or no",
           a.release_heap);
  std::vector<double> ms, cpu_ms;
  const std::string precision_label = fp8 ? "fp8-" + a.fp8_scaling : a.precision;
  double last_loss = 0.0;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    // Peaks over the timed steps only: the warm-up creates the optimizer state and, for budget, the plan.
    if (s == a.warmup) {
      allocator.reset_peak();
      host.reset_peak();
    }
    if (a.release_heap == "yes") train::release_free_heap();
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    const double seed = scaler ? scaler->scale() : 1.0;
    {
      CategoryGuard category(MemoryCategory::activations);  // backward's gradients are tagged by the engine
      amp::Autocast autocast(mode);
      std::optional<ops::LossGradientSeed> declared;
      if (a.head_grads == "forward") declared.emplace(seed);
      std::optional<ops::HeadGemmsInComputeDtype> narrow_head;
      if (a.head_gemm == "compute") narrow_head.emplace();
      loss = model.loss(idx, targets);
    }
    autograd::backward({loss}, {full({}, seed, loss.dtype(), loss.device())});
    std::vector<Tensor> grads;
    for (const Tensor& p : params) grads.push_back(p.grad());
    const bool finite = !scaler || scaler->unscale_(grads);
    if (finite) opt->step();
    if (scaler) scaler->update(!finite);
    if (fp8) fp8->update_scales();
    skipped += !finite;
    opt->zero_grad();
    if (device.is_cuda()) cuda::synchronize(device.index);  // the step is done when the device is
    const auto t1 = std::chrono::steady_clock::now();
    const double dc = 1e3 * (cpu_seconds() - c0);
    last_loss = loss.item();
    const double dt = std::chrono::duration<double, std::milli>(t1 - t0).count();
    fmt::print("  step {:2d}{} {:9.1f} ms  (cpu {:9.1f} ms)  loss {:.4f}\n", s,
               s < a.warmup ? " (warm-up)" : "          ", dt, dc, last_loss);
    std::fflush(stdout);
    if (s >= a.warmup) ms.push_back(dt), cpu_ms.push_back(dc);
  }
  const double median = median_of(ms), cpu_median = median_of(cpu_ms);
  const double tok_s = static_cast<double>(a.batch * a.seq_len) / (median * 1e-3);
  const double rss_mib = static_cast<double>(peak_rss_kib()) / 1024.0;
  const MemoryStats mem = allocator.stats();
  const CategoryStats& act = mem[MemoryCategory::activations];
  const CategoryStats& copies = mem[MemoryCategory::compute_weights];
  const ckpt::BlockCheckpointer& checkpointer = model.checkpointing();
  const auto& plan = checkpointer.plan();
  const double alloc_mib = mib(mem.peak_bytes);
  fmt::print("{}\n", checkpointer.describe(cfg.n_layer));
  if (scaler) fmt::print("fp16: {} of {} steps skipped, final loss scale {}\n", skipped, a.warmup + a.steps, scaler->scale());
  fmt::print("median step {:.1f} ms (cpu {:.1f} ms), {:.0f} tokens/s, peak RSS {:.0f} MiB, {} allocator peak {:.0f} MiB "
             "(activations: peak {:.1f} MiB, {:.1f} MiB at the total peak; optimizer state {:.1f} MiB), peak reserved "
             "{:.0f} MiB = {:.3f}x the peak\n",
             median, cpu_median, tok_s, rss_mib, device.str(), alloc_mib, mib(act.peak_bytes), mib(act.at_total_peak),
             mib(opt->state_bytes()), mib(mem.reserved_peak_bytes),
             static_cast<double>(mem.reserved_peak_bytes) / static_cast<double>(mem.peak_bytes));
  if (device.is_cuda()) fmt::print("host allocator peak {:.1f} MiB\n", mib(host.stats().peak_bytes));
  // plan_kept_bytes: what the budget plan keeps in the blocks (its bound), 0 without a plan.
  fmt::print("RESULT impl=memtrain model={} B={} T={} threads={} step_ms={:.1f} cpu_ms={:.1f} tok_s={:.0f} "
             "rss_mib={:.0f} alloc_mib={:.0f} policy={} act_peak_bytes={} act_at_peak_bytes={} total_peak_bytes={} "
             "plan_kept_bytes={} precision={} weight_copies_peak_bytes={} loss={:.4f} device={} optimizer={} "
             "galore_rank={} optim_state_bytes={} host_peak_bytes={} head_grads={} head_gemm={} "
             "reserved_peak_bytes={}\n",
             a.model, a.batch, a.seq_len, omp_get_max_threads(), median, cpu_median, tok_s, rss_mib, alloc_mib,
             checkpointer.policy().to_string(), act.peak_bytes, act.at_total_peak, mem.peak_bytes,
             plan ? plan->kept_bytes : std::size_t{0}, precision_label, copies.peak_bytes, last_loss, device.str(),
             a.optimizer, a.galore_rank, opt->state_bytes(), host.stats().peak_bytes, a.head_grads, a.head_gemm,
             mem.reserved_peak_bytes);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());  // memtrain::Error names the op already
  return 1;
}
