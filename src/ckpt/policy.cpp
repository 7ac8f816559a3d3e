// Checkpoint policies, the budget planner and the per-model block runner (see policy.h).
#include "memtrain/ckpt/policy.h"

#include "memtrain/autograd/grad_mode.h"
#include "memtrain/ckpt/op_label.h"
#include "memtrain/core/error.h"
#include "core/phase_marks.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace memtrain::ckpt {
namespace {

constexpr const char* kPolicy = "ckpt::Policy";
constexpr const char* kForms =
    "none, full, every:K, selective, selective:op1,op2 (each op, op@label or @label), "
    "budget:SIZE (bytes, KiB, MiB, GiB)";

std::int64_t parse_int(std::string_view text, std::string_view whole) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  MT_CHECK(ec == std::errc() && end == text.data() + text.size(), kPolicy, "'{}': '{}' is not an integer (forms: {})",
           whole, text, kForms);
  return v;
}

std::size_t parse_size(std::string_view text, std::string_view whole) {
  static constexpr std::pair<std::string_view, std::size_t> kUnits[] = {
      {"GiB", std::size_t{1} << 30}, {"MiB", std::size_t{1} << 20}, {"KiB", std::size_t{1} << 10}, {"B", 1}};
  std::size_t unit = 1;
  for (const auto& [suffix, bytes] : kUnits) {
    if (text.size() > suffix.size() && text.ends_with(suffix)) {
      text.remove_suffix(suffix.size());
      unit = bytes;
      break;
    }
  }
  const std::int64_t n = parse_int(text, whole);
  MT_CHECK(n > 0, kPolicy, "'{}': the budget must be positive", whole);
  return static_cast<std::size_t>(n) * unit;
}

std::string size_str(std::size_t bytes) {
  if (bytes % (std::size_t{1} << 30) == 0) return fmt::format("{}GiB", bytes >> 30);
  if (bytes % (std::size_t{1} << 20) == 0) return fmt::format("{}MiB", bytes >> 20);
  if (bytes % (std::size_t{1} << 10) == 0) return fmt::format("{}KiB", bytes >> 10);
  return std::to_string(bytes);
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// "blocks 0-3: selective, blocks 4-11: full": runs of equal modes.
std::string describe_modes(const std::vector<RegionMode>& modes) {
  std::string out;
  for (std::size_t i = 0; i < modes.size();) {
    std::size_t j = i;
    while (j + 1 < modes.size() && modes[j + 1] == modes[i]) ++j;
    if (!out.empty()) out += ", ";
    out += i == j ? fmt::format("block {}: {}", i, region_mode_name(modes[i]))
                  : fmt::format("blocks {}-{}: {}", i, j, region_mode_name(modes[i]));
    i = j + 1;
  }
  return out;
}

}  // namespace

const char* region_mode_name(RegionMode mode) {
  switch (mode) {
    case RegionMode::none: return "none";
    case RegionMode::selective: return "selective";
    case RegionMode::full: return "full";
  }
  return "?";
}

Policy Policy::full() {
  Policy p;
  p.kind = Kind::full;
  return p;
}

Policy Policy::every(std::int64_t k) {
  MT_CHECK(k >= 1, kPolicy, "every(k) needs k >= 1, got {}", k);
  Policy p;
  p.kind = Kind::every;
  p.every_k = k;
  return p;
}

Policy Policy::selective(std::vector<std::string> keep_ops) {
  MT_CHECK(!keep_ops.empty(), kPolicy, "selective needs at least one op whose outputs it keeps");
  for (const std::string& entry : keep_ops) check_keep_entry(entry, kPolicy);
  Policy p;
  p.kind = Kind::selective;
  p.keep_ops = std::move(keep_ops);
  return p;
}

Policy Policy::budget(std::size_t bytes) {
  MT_CHECK(bytes > 0, kPolicy, "budget(bytes) needs a positive budget");
  Policy p;
  p.kind = Kind::budget;
  p.budget_bytes = bytes;
  return p;
}

Policy Policy::parse(std::string_view text) {
  const std::size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const std::string_view arg = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  const bool has_arg = colon != std::string_view::npos;
  if (name == "none" && !has_arg) return none();
  if (name == "full" && !has_arg) return full();
  if (name == "every" && has_arg) return every(parse_int(arg, text));
  if (name == "budget" && has_arg) return budget(parse_size(arg, text));
  if (name == "selective") {
    if (!has_arg) return selective();
    std::vector<std::string> ops;
    for (std::size_t start = 0; start <= arg.size();) {
      const std::size_t comma = std::min(arg.find(',', start), arg.size());
      MT_CHECK(comma > start, kPolicy, "'{}': empty op name in the list", text);
      ops.emplace_back(arg.substr(start, comma - start));
      start = comma + 1;
    }
    return selective(std::move(ops));
  }
  MT_CHECK(false, kPolicy, "unknown checkpoint policy '{}' (forms: {})", text, kForms);
  return {};
}

std::string Policy::to_string() const {
  switch (kind) {
    case Kind::none: return "none";
    case Kind::full: return "full";
    case Kind::every: return fmt::format("every:{}", every_k);
    case Kind::selective:
      return keep_ops == default_keep_ops() ? "selective" : fmt::format("selective:{}", fmt::join(keep_ops, ","));
    case Kind::budget: return fmt::format("budget:{}", size_str(budget_bytes));
  }
  return "?";
}

RegionCost region_cost(const RegionProfile& p, RegionMode mode) {
  const double cheap = kFlopsPerSavedByte * static_cast<double>(p.cheap_saved_bytes);
  switch (mode) {
    case RegionMode::none: return {p.input_bytes + p.saved_bytes, 0.0};
    case RegionMode::selective: return {p.input_bytes + p.expensive_bytes, cheap + p.unsaved_expensive_flops};
    case RegionMode::full: return {p.input_bytes, p.full_rerun_flops + cheap};
  }
  return {};
}

Plan plan_budget(const std::vector<RegionProfile>& profiles, std::size_t budget_bytes) {
  constexpr RegionMode kModes[] = {RegionMode::none, RegionMode::selective, RegionMode::full};
  Plan plan;
  plan.budget_bytes = budget_bytes;
  const std::size_t n = profiles.size();
  plan.modes.assign(n, RegionMode::full);
  std::size_t minimum = 0;
  for (const RegionProfile& p : profiles) minimum += region_cost(p, RegionMode::full).kept_bytes;
  if (minimum > budget_bytes) {
    plan.feasible = false;
  } else {
    // Multiple-choice knapsack by dynamic programming over the budget in `units` steps. Sizes round up, so a
    // plan that fits in units fits in bytes.
    constexpr std::size_t kUnits = 4096;
    const std::size_t unit = std::max<std::size_t>(1, (budget_bytes + kUnits - 1) / kUnits);
    const std::size_t capacity = budget_bytes / unit;
    constexpr double kInf = std::numeric_limits<double>::infinity();
    std::vector<double> best(capacity + 1, 0.0);  // best[c]: least recompute of the regions so far within c units
    std::vector<std::vector<std::uint8_t>> choice(n, std::vector<std::uint8_t>(capacity + 1, 0));
    for (std::size_t r = 0; r < n; ++r) {
      std::vector<double> next(capacity + 1, kInf);
      for (std::size_t m = 0; m < 3; ++m) {
        const RegionCost cost = region_cost(profiles[r], kModes[m]);
        const std::size_t size = (cost.kept_bytes + unit - 1) / unit;
        for (std::size_t c = size; c <= capacity; ++c) {
          const double total = best[c - size] + cost.recompute;
          if (total < next[c]) {
            next[c] = total;
            choice[r][c] = static_cast<std::uint8_t>(m);
          }
        }
      }
      best = std::move(next);
    }
    if (best[capacity] == kInf) {
      plan.feasible = false;  // rounding up made the all-full plan miss by less than a unit per region
    } else {
      std::size_t c = capacity;
      for (std::size_t r = n; r-- > 0;) {
        plan.modes[r] = kModes[choice[r][c]];
        c -= (region_cost(profiles[r], plan.modes[r]).kept_bytes + unit - 1) / unit;
      }
    }
  }
  for (std::size_t r = 0; r < n; ++r) {
    const RegionCost cost = region_cost(profiles[r], plan.modes[r]);
    plan.kept_bytes += cost.kept_bytes;
    plan.recompute += cost.recompute;
  }
  return plan;
}

std::string Plan::describe() const {
  std::string out = fmt::format("budget {:.2f} MiB: {}; keeps {:.2f} MiB, recomputes {:.3g} GFLOP-eq", mib(budget_bytes),
                                describe_modes(modes), mib(kept_bytes), recompute / 1e9);
  if (!feasible) out += " (over budget: every block already full, the least this model can keep)";
  return out;
}

void BlockCheckpointer::set_policy(Policy policy) {
  policy_ = std::move(policy);
  profiles_.clear();
  plan_.reset();
}

RegionMode BlockCheckpointer::mode_of(std::int64_t block, std::int64_t num_blocks) const {
  MT_CHECK(block >= 0 && block < num_blocks, "ckpt::BlockCheckpointer", "block {} outside [0, {})", block, num_blocks);
  switch (policy_.kind) {
    case Policy::Kind::none: return RegionMode::none;
    case Policy::Kind::full: return RegionMode::full;
    case Policy::Kind::every: return block % policy_.every_k == 0 ? RegionMode::full : RegionMode::none;
    case Policy::Kind::selective: return RegionMode::selective;
    case Policy::Kind::budget:
      if (!plan_) return RegionMode::full;  // the profiling forward
      MT_CHECK(plan_->modes.size() == static_cast<std::size_t>(num_blocks), "ckpt::BlockCheckpointer",
               "the budget plan covers {} blocks, the model now runs {}", plan_->modes.size(), num_blocks);
      return plan_->modes[block];
  }
  return RegionMode::none;
}

Tensor BlockCheckpointer::run(std::int64_t block, std::int64_t num_blocks,
                              const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  // Blocks are marked in the training forward (an evaluation's many short forwards would only crowd the marks).
  if (autograd::grad_enabled() && ::memtrain::detail::phase_listener_installed())
    ::memtrain::detail::mark_phase(fmt::format("block {}/{}", block + 1, num_blocks));
  const RegionMode mode = mode_of(block, num_blocks);
  const bool profiling = policy_.kind == Policy::Kind::budget && !plan_ && autograd::grad_enabled();
  if (mode == RegionMode::none || !autograd::grad_enabled()) return fn(x);
  RegionOptions options;
  if (mode == RegionMode::selective) options.keep_ops = policy_.keep_ops;
  options.profile_ops = policy_.keep_ops;
  if (!profiling) return checkpoint(fn, x, options);
  if (block == 0) profiles_.clear();
  RegionProfile profile;
  Tensor y = checkpoint(fn, x, options, &profile);
  profiles_.push_back(profile);
  if (block == num_blocks - 1 && profiles_.size() == static_cast<std::size_t>(num_blocks)) {
    plan_ = plan_budget(profiles_, policy_.budget_bytes);
  }
  return y;
}

std::string BlockCheckpointer::describe(std::int64_t num_blocks) const {
  const std::string keeps = fmt::format("selective keeps the outputs of {}", fmt::join(policy_.keep_ops, ", "));
  switch (policy_.kind) {
    case Policy::Kind::none: return "checkpointing none: every block keeps what its ops save";
    case Policy::Kind::full: return fmt::format("checkpointing full: blocks 0-{} keep only their inputs", num_blocks - 1);
    case Policy::Kind::every:
      return fmt::format("checkpointing every:{}: blocks 0, {}, ... keep only their inputs, the others everything",
                         policy_.every_k, policy_.every_k);
    case Policy::Kind::selective:
      return fmt::format("checkpointing selective: blocks 0-{}; {}", num_blocks - 1, keeps);
    case Policy::Kind::budget:
      if (!plan_) return fmt::format("checkpointing {}: not planned yet (the first forward profiles)", policy_.to_string());
      return fmt::format("checkpointing {}: {}; {}", policy_.to_string(), plan_->describe(), keeps);
  }
  return "";
}

}  // namespace memtrain::ckpt
