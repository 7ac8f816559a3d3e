// fit_to_budget and the cost model (memtrain/train/fit.h).
#include "memtrain/train/fit.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/core/file_arena.h"
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

// How much a checkpoint policy recomputes, for the visiting order and the dominance rules: none, selective,
// every:2, full; a budget policy lies between full and none (it keeps what its byte budget allows).
enum class Recompute { none, selective, every2, full, budget };

Recompute recompute_of(const ckpt::Policy& p) {
  switch (p.kind) {
    case ckpt::Policy::Kind::none: return Recompute::none;
    case ckpt::Policy::Kind::full: return Recompute::full;
    case ckpt::Policy::Kind::selective: return Recompute::selective;
    case ckpt::Policy::Kind::budget: return Recompute::budget;
    case ckpt::Policy::Kind::every: return Recompute::every2;  // every:K: the base's own, kept as given
  }
  return Recompute::none;
}

// a keeps no more activations than b: full <= every:2, selective, budget <= none (every:2, selective and a budget
// are unordered among themselves).
bool keeps_no_more(Recompute a, Recompute b) {
  if (a == b || b == Recompute::none || a == Recompute::full) return true;
  return false;
}

struct Knobs {
  amp::Precision precision;
  amp::ParamDtype param_dtype;
  optim::OptimizerKind state;
  std::int64_t galore_rank;
  bool layerwise;
  bool offload;  // optimizer state in files (FitKnobs::offload_dir)
  ckpt::Policy policy;
  std::int64_t micro_batch;
  std::int64_t accumulation;  // micro-batches per step
  std::int64_t zero;          // the ZeRO stage (data parallel)

  Recompute recompute() const { return recompute_of(policy); }
  // The state knobs: candidates that share them differ only in activation memory and recompute time.
  bool same_state(const Knobs& o) const {
    return precision == o.precision && param_dtype == o.param_dtype && state == o.state &&
           galore_rank == o.galore_rank && layerwise == o.layerwise && offload == o.offload && zero == o.zero;
  }
};

bool is_8bit(optim::OptimizerKind k) {
  return k == optim::OptimizerKind::adamw8bit || k == optim::OptimizerKind::lion8bit;
}

// a needs no more memory than b in every monotone knob (precision, the parameters' dtype, GaLore and the ZeRO
// stage must match: not monotone; a higher stage shards state and gradients but adds gather and bucket buffers,
// which on a small model can outweigh what it shards). A smaller micro-batch needs less, except against a
// layer-wise step without accumulation, which frees each gradient during the backward: accumulating keeps every
// gradient until the last micro-batch. State in files needs no more than state in memory.
bool needs_no_more(const Knobs& a, const Knobs& b) {
  const bool batch_ok = a.micro_batch <= b.micro_batch && !(b.layerwise && b.accumulation == 1 && a.accumulation > 1);
  return a.precision == b.precision && a.param_dtype == b.param_dtype && a.galore_rank == b.galore_rank &&
         a.zero == b.zero && (a.state == b.state || (is_8bit(a.state) && !is_8bit(b.state))) &&
         (a.layerwise || !b.layerwise) && (a.offload || !b.offload) && keeps_no_more(a.recompute(), b.recompute()) &&
         batch_ok;
}

// a is no slower than b: the same state knobs, no more recompute and a micro-batch at least as large.
bool no_slower(const Knobs& a, const Knobs& b) {
  return a.same_state(b) && keeps_no_more(b.recompute(), a.recompute()) && a.micro_batch >= b.micro_batch;
}

// How much recompute a policy costs, for the visiting order: none, selective, every:2 (or a budget), full.
int recompute_rank(Recompute r) { return r == Recompute::budget ? 2 : static_cast<int>(r); }

std::string describe(const Knobs& k, const TrainerConfig& c) {
  std::string s = fmt::format("{}, {}", amp::precision_name(k.precision), optim::kind_name(k.state));
  if (k.param_dtype != amp::ParamDtype::f32) s += fmt::format(", params {}", amp::param_dtype_name(k.param_dtype));
  if (k.galore_rank > 0) s += fmt::format(", galore r{}", k.galore_rank);
  s += fmt::format(", ckpt {}, micro-batch {} x {}", k.policy.to_string(), k.micro_batch, c.grad_accum);
  if (k.layerwise) s += ", layer-wise";
  if (k.offload) s += ", offload";
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

// Each of `knobs` once per value of one knob (set by `set`): the cross product, one knob at a time.
template <typename T, typename Set>
void vary(std::vector<Knobs>& knobs, const std::vector<T>& values, Set set) {
  std::vector<Knobs> out;
  for (const Knobs& k : knobs)
    for (const T& v : values) {
      out.push_back(k);
      set(out.back(), v);
    }
  knobs = std::move(out);
}

// The values a free knob takes: the base configuration's first (fp16 compute, bf16-kahan weights stay
// candidates), then the others of `values`.
template <typename T>
std::vector<T> base_and(const T& base, std::vector<T> values) {
  std::erase(values, base);
  values.insert(values.begin(), base);
  return values;
}

// `base` with a candidate's knobs, checked: a combination the configuration refuses (layer-wise GaLore across
// ranks, bf16 weights under fp32 compute, ...) is kept in the report with the reason, never predicted.
Candidate make_candidate(const Knobs& k, const TrainerConfig& base, const std::string& offload_dir) {
  Candidate c{k, base, {}};
  TrainerConfig& config = c.config;
  config.precision = k.precision;
  config.param_dtype = k.param_dtype;
  config.optimizer.kind = k.state;
  config.galore_rank = k.galore_rank;
  config.layerwise_update = k.layerwise;
  if (!offload_dir.empty()) config.offload_optimizer = k.offload ? "file:" + offload_dir : "none";
  config.zero = k.zero;
  config.activation_checkpointing = k.policy;
  config.micro_batch = k.micro_batch;
  config.grad_accum = k.accumulation;
  config.memory_budget_bytes.reset();
  c.report.knobs = describe(k, config);
  try {
    config.validate();
  } catch (const Error& e) {
    c.refused = true;
    c.report.note = fmt::format("refused: {}", e.what());
  }
  return c;
}

std::vector<Candidate> candidates(const TrainerConfig& base, const FitKnobs& free, std::int64_t galore_rank) {
  const Knobs fixed{base.precision,
                    base.param_dtype,
                    base.optimizer.kind,
                    base.galore_rank,
                    base.layerwise_update,
                    !offload_directory(base.offload_optimizer).empty(),
                    base.activation_checkpointing,
                    base.micro_batch,
                    base.grad_accum,
                    base.zero};
  std::vector<Knobs> knobs{fixed};
  if (free.precision)
    vary(knobs, base_and(base.precision, {amp::Precision::fp32, amp::Precision::bf16}),
         [](Knobs& k, auto v) { k.precision = v; });
  // bf16 weights are the compute copies themselves, on one rank beside no adapters (TrainerConfig::validate):
  // offered where they can be, rather than listed as refused.
  if (free.param_dtype && base.world_size == 1 && !base.lora.enabled() && base.lisa_layers == 0) {
    vary(knobs, base_and(base.param_dtype, {amp::ParamDtype::f32, amp::ParamDtype::bf16}),
         [](Knobs& k, auto v) { k.param_dtype = v; });
    std::erase_if(knobs, [](const Knobs& k) {
      return k.param_dtype != amp::ParamDtype::f32 && k.precision != amp::Precision::bf16 &&
             k.precision != amp::Precision::fp8;
    });
  }
  if (free.optimizer_state && other_precision(base.optimizer.kind) != base.optimizer.kind)
    vary(knobs, std::vector{base.optimizer.kind, other_precision(base.optimizer.kind)},
         [](Knobs& k, auto v) { k.state = v; });
  if (free.galore && galore_rank > 0)
    vary(knobs, std::vector<std::int64_t>{0, base.galore_rank > 0 ? base.galore_rank : galore_rank},
         [](Knobs& k, auto v) { k.galore_rank = v; });
  if (free.layerwise) vary(knobs, std::vector{false, true}, [](Knobs& k, auto v) { k.layerwise = v; });
  if (!free.offload_dir.empty()) vary(knobs, std::vector{false, true}, [](Knobs& k, auto v) { k.offload = v; });
  if (free.zero && base.world_size > 1)
    vary(knobs, std::vector<std::int64_t>{0, 1, 2}, [](Knobs& k, auto v) { k.zero = v; });
  // A base policy the search does not enumerate (every:K, budget, selective with ops) stays as given when the
  // checkpointing knob is fixed.
  if (free.checkpointing)
    vary(knobs, std::vector{ckpt::Policy::none(), ckpt::Policy::selective(), ckpt::Policy::every(2), ckpt::Policy::full()},
         [](Knobs& k, const ckpt::Policy& v) { k.policy = v; });
  if (free.accumulation) {
    const std::int64_t global = base.micro_batch * base.grad_accum;
    std::vector<std::int64_t> micro_batches;
    for (std::int64_t mb = global; mb >= 1; mb /= 2)
      if (global % mb == 0) micro_batches.push_back(mb);
    vary(knobs, micro_batches, [global](Knobs& k, std::int64_t mb) {
      k.micro_batch = mb;
      k.accumulation = global / mb;
    });
  }
  std::vector<Candidate> out;
  for (const Knobs& k : knobs) out.push_back(make_candidate(k, base, free.offload_dir));
  // Fastest-looking first: little recompute, large micro-batches; bf16 and 32-bit state, f32 weights and state in
  // memory before the others.
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    const auto key = [](const Knobs& k) {
      return std::make_tuple(recompute_rank(k.recompute()), -k.micro_batch, k.galore_rank > 0,
                             k.param_dtype != amp::ParamDtype::f32, is_8bit(k.state), k.layerwise, k.offload, k.zero);
    };
    return key(a.knobs) < key(b.knobs);
  });
  return out;
}

// Between two candidates that fit: one without GaLore first (GaLore changes what is learned: a low-rank update),
// then one with f32 weights (bf16 weights round every update), then the faster by the cost model.
bool preferred(const Candidate& a, const Candidate& b) {
  if ((a.knobs.galore_rank > 0) != (b.knobs.galore_rank > 0)) return a.knobs.galore_rank == 0;
  const bool a_narrow = a.knobs.param_dtype != amp::ParamDtype::f32, b_narrow = b.knobs.param_dtype != amp::ParamDtype::f32;
  if (a_narrow != b_narrow) return !a_narrow;
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

// Predicts `c` and fills in its report: whether it fits the budget, its peak and the cost model's step time.
// Returns the prediction of its largest rank, or nullopt when it does not fit.
std::optional<MemoryPrediction> weigh(Candidate& c, std::size_t budget_bytes, const RunInputs& inputs,
                                      const CostModel& cost) {
  c.report.predicted = true;
  const std::optional<Needs> n = predict_every_rank(c.config, budget_bytes, inputs, cost);
  if (!n || n->largest.peak_bytes_total > budget_bytes) {  // host data added after the meta run may tip it over
    c.report.peak_bytes = n ? n->largest.peak_bytes_total : budget_bytes;
    c.report.note = n ? "" : "over the budget";
    return std::nullopt;
  }
  c.report.fits = true;
  c.report.peak_bytes = n->largest.peak_bytes_total;
  c.report.largest_rank = n->largest_rank;
  c.report.step_seconds = cost.step_seconds(n->slowest);
  return n->largest;
}

// The checkpoint budget policy as a knob: a candidate that fits only by recomputing (full, every:2, selective:
// its twin without recompute did not fit) may fit with a budget:X policy that keeps the activations the budget
// still has room for, recomputing less. For the best few such candidates (by preference), X is the largest
// activation budget whose prediction fits, found by bisection to 1/64 of the memory budget. Returns those
// found, with their reports filled in and their predictions.
struct Weighed {
  Candidate candidate;
  MemoryPrediction prediction;
};
std::vector<Weighed> fill_headroom(const std::vector<const Candidate*>& fitting, const TrainerConfig& base,
                                   std::size_t budget_bytes, const RunInputs& inputs, const FitKnobs& free,
                                   const CostModel& cost) {
  std::vector<Weighed> out;
  if (!free.checkpointing) return out;
  constexpr std::size_t kRefined = 3;
  std::vector<const Candidate*> recomputing;
  for (const Candidate* c : fitting)
    if (c->knobs.recompute() != Recompute::none && c->knobs.recompute() != Recompute::budget) recomputing.push_back(c);
  std::stable_sort(recomputing.begin(), recomputing.end(),
                   [](const Candidate* a, const Candidate* b) { return preferred(*a, *b); });
  if (recomputing.size() > kRefined) recomputing.resize(kRefined);
  const std::size_t resolution = std::max<std::size_t>(budget_bytes / 64, 64 << 10);
  // Whole MiB (KiB for a small budget), as people write them.
  const std::size_t unit = resolution >= (std::size_t{1} << 20) ? std::size_t{1} << 20 : std::size_t{1} << 10;
  for (const Candidate* origin : recomputing) {
    std::optional<Weighed> widest;
    std::size_t fits = 0, over = budget_bytes;  // budget:fits is known to fit (0: not yet), budget:over not to
    while (over - fits > resolution) {
      const std::size_t mid = ((fits + over) / 2) / unit * unit;
      if (mid <= fits) break;  // within a unit of the answer
      Knobs k = origin->knobs;
      k.policy = ckpt::Policy::budget(mid);
      Candidate c = make_candidate(k, base, free.offload_dir);
      if (c.refused) break;
      if (std::optional<MemoryPrediction> p = weigh(c, budget_bytes, inputs, cost)) {
        fits = mid;
        widest = Weighed{std::move(c), std::move(*p)};
      } else {
        over = mid;
      }
    }
    if (widest) out.push_back(std::move(*widest));
  }
  return out;
}

}  // namespace

// ---- the cost model ----

double CostModel::step_seconds(const StepWork& w) const {
  const double communication = w.communicated_bytes > 0.0 ? w.communicated_bytes / communicated_bytes_per_second : 0.0;
  double offload = 0.0;
  if (w.offloaded_small_bytes > 0.0 || w.offloaded_huge_bytes > 0.0) {
    MT_CHECK(offload_small_bytes_per_second > 0.0 && offload_huge_bytes_per_second > 0.0, "CostModel",
             "a step with its optimizer state in files ({} bytes) needs the offload rates: calibrate_offload(dir)",
             w.offloaded_small_bytes + w.offloaded_huge_bytes);
    offload = w.offloaded_small_bytes / offload_small_bytes_per_second +
              w.offloaded_huge_bytes / offload_huge_bytes_per_second;
  }
  return w.flops_f32 / f32_flops_per_second + w.flops_narrow / narrow_flops_per_second +
         (w.allocated_bytes + w.optimizer_bytes) / bytes_per_second + communication + offload;
}

std::string CostModel::describe() const {
  std::string out = fmt::format("cost model (calibrated in {:.2f} s): f32 GEMM {:.1f} GFLOP/s, bf16 GEMM {:.1f} "
                                "GFLOP/s, memory {:.1f} GB/s, collectives {:.1f} GB/s",
                                calibration_seconds, f32_flops_per_second / 1e9, narrow_flops_per_second / 1e9,
                                bytes_per_second / 1e9, communicated_bytes_per_second / 1e9);
  if (offload_small_bytes_per_second > 0.0)
    out += fmt::format(", state in files {:.1f} GB/s in 4 KiB pages, {:.1f} GB/s in 2 MiB folios",
                       offload_small_bytes_per_second / 1e9, offload_huge_bytes_per_second / 1e9);
  return out;
}

void CostModel::calibrate_offload(const std::string& dir) {
  const auto t0 = Clock::now();
  const auto files = std::make_shared<FileArena>(dir);
  const StateArenaGuard placed(files);
  const CategoryGuard category(MemoryCategory::optimizer_state);
  // What a step adds per slice of state: its pages mapped at once before it is stepped and handed back after.
  // The warm-up call of median_seconds brings the pages into the page cache, where a run's state stays.
  const auto rate = [](std::int64_t elements, int count) {
    std::vector<Tensor> state;
    for (int i = 0; i < count; ++i) state.push_back(zeros({elements}));
    const double s = median_seconds(3, [&] {
      for (const Tensor& t : state) {
        prepare_state_pages(t);
        release_state_pages(t);
      }
    });
    return static_cast<double>(elements) * sizeof(float) * count / s;
  };
  static_assert((std::int64_t{8} << 20) * sizeof(float) >= FileArena::kHugeMappingBytes);
  offload_small_bytes_per_second = rate(std::int64_t{64} << 10, 64);  // 256 KiB each: 4 KiB pages
  offload_huge_bytes_per_second = rate(std::int64_t{8} << 20, 1);     // 32 MiB: 2 MiB folios
  calibration_seconds += seconds_since(t0);
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
  const std::string offload_dir =
      free.offload_dir.empty() ? offload_directory(base.offload_optimizer) : free.offload_dir;
  if (!offload_dir.empty() && result.cost_model.offload_small_bytes_per_second == 0.0)
    result.cost_model.calibrate_offload(offload_dir);

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

    std::optional<MemoryPrediction> p = weigh(c, budget_bytes, inputs, result.cost_model);
    if (!p) {
      over.push_back(&c);
      continue;
    }
    fitting.push_back(&c);
    if (!best || preferred(c, all[*best])) {
      best = i;
      result.chosen_prediction = std::move(p);
    }
  }
  for (Weighed& w : fill_headroom(fitting, base, budget_bytes, inputs, free, result.cost_model)) {
    all.push_back(std::move(w.candidate));
    if (!best || preferred(all.back(), all[*best])) {
      best = all.size() - 1;
      result.chosen_prediction = std::move(w.prediction);
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
