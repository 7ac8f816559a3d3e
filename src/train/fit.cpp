// fit_to_budget and the cost model (memtrain/train/fit.h).
#include "memtrain/train/fit.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/optim/galore.h"
#include "train/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace memtrain::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Median wall time of `runs` calls of f after one warm-up call.
template <typename F>
double median_seconds(int runs, F f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---- the knobs of a candidate, each with its place in the memory and time orders ----

enum class Recompute { none, selective, every2, full };

ckpt::Policy recompute_policy(Recompute r) {
  switch (r) {
    case Recompute::none: return ckpt::Policy::none();
    case Recompute::selective: return ckpt::Policy::selective();
    case Recompute::every2: return ckpt::Policy::parse("every:2");
    case Recompute::full: return ckpt::Policy::full();
  }
  return ckpt::Policy::none();
}

// a keeps no more activations than b: full <= every:2, selective <= none (every:2 and selective are unordered).
bool keeps_no_more(Recompute a, Recompute b) {
  if (a == b || b == Recompute::none || a == Recompute::full) return true;
  return false;
}

struct Knobs {
  amp::Precision precision;
  optim::OptimizerKind state;
  std::int64_t galore_rank;
  bool layerwise;
  Recompute recompute;
  std::int64_t micro_batch;
  std::int64_t accumulation;  // micro-batches per step
  std::int64_t zero;          // the ZeRO stage (data parallel)

  // The state knobs: candidates that share them differ only in activation memory and recompute time.
  bool same_state(const Knobs& o) const {
    return precision == o.precision && state == o.state && galore_rank == o.galore_rank &&
           layerwise == o.layerwise && zero == o.zero;
  }
};

bool is_8bit(optim::OptimizerKind k) {
  return k == optim::OptimizerKind::adamw8bit || k == optim::OptimizerKind::lion8bit;
}

// a needs no more memory than b in every monotone knob (precision, GaLore and the ZeRO stage must match: not
// monotone; a higher stage shards state and gradients but adds gather and bucket buffers, which on a small model
// can outweigh what it shards). A smaller micro-batch needs less, except against a layer-wise step without
// accumulation, which frees each gradient during the backward: accumulating keeps every gradient until the last
// micro-batch.
bool needs_no_more(const Knobs& a, const Knobs& b) {
  const bool batch_ok = a.micro_batch <= b.micro_batch && !(b.layerwise && b.accumulation == 1 && a.accumulation > 1);
  return a.precision == b.precision && a.galore_rank == b.galore_rank && a.zero == b.zero &&
         (a.state == b.state || (is_8bit(a.state) && !is_8bit(b.state))) && (a.layerwise || !b.layerwise) &&
         keeps_no_more(a.recompute, b.recompute) && batch_ok;
}

// a is no slower than b: the same state knobs, no more recompute and a micro-batch at least as large.
bool no_slower(const Knobs& a, const Knobs& b) {
  return a.same_state(b) && keeps_no_more(b.recompute, a.recompute) && a.micro_batch >= b.micro_batch;
}

// How much recompute a policy costs, for the visiting order: none, selective, every:2, full.
int recompute_rank(Recompute r) { return static_cast<int>(r); }

std::string describe(const Knobs& k, const TrainerConfig& c) {
  std::string s = fmt::format("{}, {}", amp::precision_name(k.precision), optim::kind_name(k.state));
  if (k.galore_rank > 0) s += fmt::format(", galore r{}", k.galore_rank);
  s += fmt::format(", ckpt {}, micro-batch {} x {}", c.activation_checkpointing.to_string(), k.micro_batch,
                   c.grad_accum);
  if (k.layerwise) s += ", layer-wise";
  if (c.world_size > 1) s += fmt::format(", zero {}", k.zero);
  return s;
}

optim::OptimizerKind other_precision(optim::OptimizerKind k) {
  switch (k) {
    case optim::OptimizerKind::adamw: return optim::OptimizerKind::adamw8bit;
    case optim::OptimizerKind::adamw8bit: return optim::OptimizerKind::adamw;
    case optim::OptimizerKind::lion: return optim::OptimizerKind::lion8bit;
    case optim::OptimizerKind::lion8bit: return optim::OptimizerKind::lion;
    default: return k;
  }
}

Recompute recompute_of(const ckpt::Policy& p) {
  if (p == ckpt::Policy::none()) return Recompute::none;
  if (p == ckpt::Policy::full()) return Recompute::full;
  if (p == ckpt::Policy::selective()) return Recompute::selective;
  return Recompute::every2;  // every:K and budget policies are kept as the base's own (see candidates())
}

// A quarter of the smallest dimension of the weights GaLore would project (those `targets` chooses; empty:
// the default rule), at least 1; 0 when none.
std::int64_t default_galore_rank(const RunInputs& inputs, const std::vector<std::string>& targets) {
  RngStateGuard rng;
  std::shared_ptr<nn::Module> model;
  {
    nn::ParameterDeviceGuard on_meta(Device::meta());
    model = inputs.make_model();
  }
  std::int64_t smallest = std::numeric_limits<std::int64_t>::max();
  for (const auto& [name, p] : model->named_parameters())
    if (optim::is_galore_target(name, p, targets)) smallest = std::min({smallest, p.size(0), p.size(1)});
  return smallest == std::numeric_limits<std::int64_t>::max() ? 0 : std::max<std::int64_t>(1, smallest / 4);
}

struct Candidate {
  Knobs knobs;
  TrainerConfig config;
  FitCandidate report;
  bool refused = false;  // config.validate() refused the combination (the reason in report.note)
};

std::vector<Candidate> candidates(const TrainerConfig& base, const FitKnobs& free, std::int64_t galore_rank) {
  std::vector<amp::Precision> precisions{base.precision};
  if (free.precision)
    for (const amp::Precision p : {amp::Precision::fp32, amp::Precision::bf16})
      if (p != base.precision) precisions.push_back(p);
  std::vector<optim::OptimizerKind> states{base.optimizer.kind};
  if (free.optimizer_state && other_precision(base.optimizer.kind) != base.optimizer.kind)
    states.push_back(other_precision(base.optimizer.kind));
  std::vector<std::int64_t> ranks{base.galore_rank};
  if (free.galore && galore_rank > 0) ranks = {0, base.galore_rank > 0 ? base.galore_rank : galore_rank};
  std::vector<bool> layerwise{base.layerwise_update};
  if (free.layerwise) layerwise = {false, true};
  std::vector<std::int64_t> zeros{base.zero};
  if (free.zero && base.world_size > 1) zeros = {0, 1, 2};
  // A base policy the search does not enumerate (every:K, budget, selective with ops) stays one of the options.
  std::vector<std::pair<Recompute, ckpt::Policy>> recomputes{
      {recompute_of(base.activation_checkpointing), base.activation_checkpointing}};
  if (free.checkpointing) {
    recomputes.clear();
    for (const Recompute r : {Recompute::none, Recompute::selective, Recompute::every2, Recompute::full})
      recomputes.emplace_back(r, recompute_policy(r));
  }
  const std::int64_t global = base.micro_batch * base.grad_accum;
  std::vector<std::int64_t> micro_batches{base.micro_batch};
  if (free.accumulation) {
    micro_batches.clear();
    for (std::int64_t mb = global; mb >= 1; mb /= 2)
      if (global % mb == 0) micro_batches.push_back(mb);
  }

  std::vector<Candidate> out;
  for (const amp::Precision p : precisions)
    for (const optim::OptimizerKind s : states)
      for (const std::int64_t r : ranks)
        for (const bool lw : layerwise)
          for (const std::int64_t zero : zeros)
            for (const auto& [rc, policy] : recomputes)
              for (const std::int64_t mb : micro_batches) {
                Candidate c{{p, s, r, lw, rc, mb, global / mb, zero}, base, {}};
                c.config.precision = p;
                c.config.optimizer.kind = s;
                c.config.galore_rank = r;
                c.config.layerwise_update = lw;
                c.config.zero = zero;
                c.config.activation_checkpointing = policy;
                c.config.micro_batch = mb;
                c.config.grad_accum = global / mb;
                c.config.memory_budget_bytes.reset();
                c.report.knobs = describe(c.knobs, c.config);
                // Some combinations are refused (layer-wise GaLore across ranks, an accumulation that is not a
                // power of two across ranks, ...): kept in the report with the reason, never predicted.
                try {
                  c.config.validate();
                } catch (const Error& e) {
                  c.refused = true;
                  c.report.note = fmt::format("refused: {}", e.what());
                }
                out.push_back(std::move(c));
              }
  // Fastest-looking first: little recompute, large micro-batches; bf16 and 32-bit state before the others.
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    const auto key = [](const Knobs& k) {
      return std::make_tuple(recompute_rank(k.recompute), -k.micro_batch, k.galore_rank > 0, is_8bit(k.state),
                             k.layerwise, k.zero);
    };
    return key(a.knobs) < key(b.knobs);
  });
  return out;
}

// Between two candidates that fit: one without GaLore first (GaLore changes what is learned: a low-rank update),
// then the faster by the cost model.
bool preferred(const Candidate& a, const Candidate& b) {
  if ((a.knobs.galore_rank > 0) != (b.knobs.galore_rank > 0)) return a.knobs.galore_rank == 0;
  return a.report.step_seconds < b.report.step_seconds;
}

// The prediction of `config`, or nullopt when the meta run passed `budget` (it stops at the first allocation past
// it, so a candidate that does not fit costs little; nullopt budget: none).
std::optional<MemoryPrediction> predict_within(const TrainerConfig& config, std::optional<std::size_t> budget,
                                               const RunInputs& inputs) {
  Allocator& meta = Allocator::get(Device::meta());
  const std::optional<std::size_t> previous = meta.budget();
  meta.set_budget(budget);
  try {
    MemoryPrediction p = predict_memory(config, inputs);
    meta.set_budget(previous);
    return p;
  } catch (const OutOfBudget&) {
    meta.set_budget(previous);
    return std::nullopt;
  } catch (...) {
    meta.set_budget(previous);
    throw;
  }
}

// What a candidate needs: the prediction of its largest rank (world_size 1: the run's), with the step work of
// its slowest rank by `cost` (the ranks wait for each other); nullopt when some rank's meta run passed `budget`.
// A data-parallel run fits only if every rank does, and ranks differ (uneven shards): the first rank whose
// peak is over the budget (host data added after the meta run may tip it over) ends the search as the largest.
struct Needs {
  MemoryPrediction largest;
  std::int64_t largest_rank = 0;
  StepWork slowest;
};

std::optional<Needs> predict_every_rank(const TrainerConfig& config, std::optional<std::size_t> budget,
                                        const RunInputs& inputs, const CostModel& cost) {
  std::optional<Needs> needs;
  for (std::int64_t r = 0; r < config.world_size; ++r) {
    RunInputs rank_inputs = inputs;
    if (config.world_size > 1) rank_inputs.prepare = inputs.prepare_rank(r);
    std::optional<MemoryPrediction> p = predict_within(config, budget, rank_inputs);
    if (!p) return std::nullopt;
    if (!needs) {
      needs = Needs{*p, r, p->step_work};
    } else {
      if (p->peak_bytes_total > needs->largest.peak_bytes_total) needs->largest = *p, needs->largest_rank = r;
      if (cost.step_seconds(p->step_work) > cost.step_seconds(needs->slowest)) needs->slowest = p->step_work;
    }
    if (budget && p->peak_bytes_total > *budget) break;
  }
  return needs;
}

}  // namespace

// ---- the cost model ----

double CostModel::step_seconds(const StepWork& w) const {
  const double communication = w.communicated_bytes > 0.0 ? w.communicated_bytes / communicated_bytes_per_second : 0.0;
  return w.flops_f32 / f32_flops_per_second + w.flops_narrow / narrow_flops_per_second +
         (w.allocated_bytes + w.optimizer_bytes) / bytes_per_second + communication;
}

std::string CostModel::describe() const {
  return fmt::format("cost model (calibrated in {:.2f} s): f32 GEMM {:.1f} GFLOP/s, bf16 GEMM {:.1f} GFLOP/s, "
                     "memory {:.1f} GB/s, collectives {:.1f} GB/s",
                     calibration_seconds, f32_flops_per_second / 1e9, narrow_flops_per_second / 1e9,
                     bytes_per_second / 1e9, communicated_bytes_per_second / 1e9);
}

CostModel CostModel::calibrate() {
  const auto t0 = Clock::now();
  RngStateGuard rng;
  CostModel m;
  {
    CategoryGuard category(MemoryCategory::workspace);
    constexpr std::int64_t kRows = 2048, kDim = 768;
    const double gemm_flops = 2.0 * kRows * kDim * kDim;
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Tensor a = randn({kRows, kDim}, dtype), b = randn({kDim, kDim}, dtype);
      const double s = median_seconds(3, [&] { (void)ops::matmul(a, b); });
      (dtype == DType::f32 ? m.f32_flops_per_second : m.narrow_flops_per_second) = gemm_flops / s;
    }
    constexpr std::int64_t kElems = std::int64_t{1} << 24;
    const Tensor x = randn({kElems}, DType::f32), y = randn({kElems}, DType::f32);
    m.bytes_per_second = static_cast<double>(kElems * 4) / median_seconds(3, [&] { (void)ops::add(x, y); });
    // MPI between the processes of one host moves data through shared memory: a copy, at memory speed.
    m.communicated_bytes_per_second = m.bytes_per_second;
  }
  m.calibration_seconds = seconds_since(t0);
  // The timing tensors' blocks would sit in the CPU cache for the whole run (and in its RSS).
  Allocator::get(Device::cpu()).empty_cache();
  return m;
}

// ---- the search ----

FitResult fit_to_budget(const TrainerConfig& base, std::size_t budget_bytes, const RunInputs& inputs,
                        const FitKnobs& free, std::optional<CostModel> cost_model) {
  const char* where = "fit_to_budget";
  MT_CHECK(budget_bytes > 0, where, "the budget must be positive");
  base.validate();
  MT_CHECK(base.world_size == 1 || inputs.prepare_rank, where,
           "world_size {}: a data-parallel run fits only if every rank does; set RunInputs::prepare_rank to "
           "dist::simulate_rank so that each rank can be predicted", base.world_size);
  const auto t0 = Clock::now();
  FitResult result;
  result.budget_bytes = budget_bytes;
  result.cost_model = cost_model ? *cost_model : CostModel::calibrate();

  std::vector<Candidate> all = candidates(base, free, free.galore ? default_galore_rank(inputs, base.galore_targets) : 0);
  // The candidates that save the most memory (no other needs less in every monotone knob): if none of them fits,
  // nothing does, and the refusal needs only these predictions.
  std::vector<const Candidate*> minimal;
  for (const Candidate& c : all) {
    bool is_minimal = !c.refused;
    for (const Candidate& o : all)
      if (&o != &c && !o.refused && needs_no_more(o.knobs, c.knobs) && !needs_no_more(c.knobs, o.knobs))
        is_minimal = false;
    if (is_minimal) minimal.push_back(&c);
  }
  MT_CHECK(!minimal.empty(), where, "every candidate configuration was refused; the first: {}",
           all.front().report.note);
  bool reachable = false;
  for (const Candidate* c : minimal) {
    const std::optional<Needs> n = predict_every_rank(c->config, budget_bytes, inputs, result.cost_model);
    if (n && n->largest.peak_bytes_total <= budget_bytes) {
      reachable = true;
      break;
    }
  }
  if (!reachable) {
    for (const Candidate* c : minimal) {
      const MemoryPrediction p = predict_every_rank(c->config, std::nullopt, inputs, result.cost_model)->largest;
      if (!result.smallest || p.peak_bytes_total < result.smallest->peak_bytes_total) {
        result.smallest = p;
        result.smallest_knobs = c->report.knobs;
      }
    }
    for (Candidate& c : all) {
      if (!c.refused) c.report.note = "skipped: not even the smallest candidates fit";
      result.candidates.push_back(c.report);
      result.candidates.back().config = c.config;
    }
    result.seconds = seconds_since(t0);
    return result;
  }

  std::vector<const Candidate*> over, fitting;
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < all.size(); ++i) {
    Candidate& c = all[i];
    for (const Candidate* o : over)
      if (c.report.note.empty() && needs_no_more(o->knobs, c.knobs))
        c.report.note = fmt::format("skipped: {} did not fit", o->report.knobs);
    for (const Candidate* f : fitting)
      if (c.report.note.empty() && no_slower(f->knobs, c.knobs))
        c.report.note = fmt::format("skipped: {} fits and is no slower", f->report.knobs);
    if (!c.report.note.empty()) continue;

    c.report.predicted = true;
    const std::optional<Needs> n = predict_every_rank(c.config, budget_bytes, inputs, result.cost_model);
    if (!n || n->largest.peak_bytes_total > budget_bytes) {  // host data added after the meta run may tip it over
      c.report.peak_bytes = n ? n->largest.peak_bytes_total : budget_bytes;
      c.report.note = n ? "" : "over the budget";
      over.push_back(&c);
      continue;
    }
    c.report.fits = true;
    c.report.peak_bytes = n->largest.peak_bytes_total;
    c.report.largest_rank = n->largest_rank;
    c.report.step_seconds = result.cost_model.step_seconds(n->slowest);
    fitting.push_back(&c);
    if (!best || preferred(c, all[*best])) {
      best = i;
      result.chosen_prediction = n->largest;
    }
  }
  for (const Candidate& c : all) {
    result.candidates.push_back(c.report);
    result.candidates.back().config = c.config;
  }
  if (best) {
    result.chosen_index = best;
    result.chosen = all[*best].config;
    result.chosen->memory_budget_bytes = budget_bytes;
  }
  result.seconds = seconds_since(t0);
  return result;
}

std::string FitResult::report() const {
  std::string out = fmt::format("fit into {}: {}\n", detail::format_bytes(budget_bytes), cost_model.describe());
  std::size_t predicted = 0;
  for (const FitCandidate& c : candidates) {
    if (!c.predicted) continue;
    ++predicted;
    out += fmt::format("  {:<4} {:>11}  {:>9}  {}\n", c.fits ? "fits" : "over",
                       c.note == "over the budget" ? std::string("> budget") : detail::format_bytes(c.peak_bytes),
                       c.fits ? fmt::format("{:.3f} s", c.step_seconds) : std::string("-"), c.knobs);
  }
  if (predicted == 0 && !chosen_index) {
    out += fmt::format("  ({} candidates: not even those that save the most memory fit; {:.1f} s)\n",
                       candidates.size(), seconds);
  } else {
    out += fmt::format("  ({} candidates, {} predicted, {} skipped by dominance; {:.1f} s)\n", candidates.size(),
                       predicted, candidates.size() - predicted, seconds);
  }
  if (chosen_index) {
    const FitCandidate& c = candidates[*chosen_index];
    const std::string rank =
        c.config.world_size > 1 ? fmt::format(" on rank {} of {}", c.largest_rank, c.config.world_size) : "";
    out += fmt::format("chosen: {} (predicted peak {}{}, step {:.3f} s)\n", c.knobs, detail::format_bytes(c.peak_bytes),
                       rank, c.step_seconds);
    return out;
  }
  out += fmt::format("nothing fits in {}.", detail::format_bytes(budget_bytes));
  if (smallest) {
    std::string dominant;
    std::size_t most = 0;
    for (const auto& [name, bytes] : smallest->peak_bytes_by_category)
      if (bytes > most) most = bytes, dominant = name;
    out += fmt::format(" The smallest prediction, {} ({}), needs {}, {} of it {}:\n{}", smallest_knobs,
                       smallest->device, detail::format_bytes(smallest->peak_bytes_total),
                       detail::format_bytes(most), dominant, smallest->report());
  } else {
    out += "\n";
  }
  return out;
}

}  // namespace memtrain::train
