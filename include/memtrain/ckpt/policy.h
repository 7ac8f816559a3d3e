// Checkpoint policies: which blocks of a model run as checkpointed regions, and what each keeps.
//   none        every block keeps what its ops save (no recomputation)
//   full        every block is a region that keeps only its input
//   every(k)    blocks 0, k, 2k, ... are full regions; the others keep everything
//   selective   every block is a region that keeps its input and the saved outputs of expensive ops (keep_ops:
//               matmul, linear, attention, conv2d by default) and recomputes the cheap ones (norms,
//               activations, dropout, elementwise). An entry may name an op under a label that the model's
//               modules set (ckpt::OpLabel): "linear@mlp.fc" keeps only the MLP's first projection (op_label.h)
//   budget(b)   per block, none / selective / full, chosen to keep at most b bytes of saved activations over
//               all blocks with the least recomputation (a multiple-choice knapsack, plan_budget below)
// A model (GPT, Llama, CNN) holds a BlockCheckpointer and routes each block's forward through it.
#pragma once

#include "memtrain/ckpt/checkpoint.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memtrain::ckpt {

enum class RegionMode { none, selective, full };
const char* region_mode_name(RegionMode mode);  // "none", "selective", "full"

struct Policy {
  enum class Kind { none, full, every, selective, budget };
  Kind kind = Kind::none;
  std::int64_t every_k = 1;
  std::size_t budget_bytes = 0;
  std::vector<std::string> keep_ops = default_keep_ops();  // selective, and budget's selective choice

  static Policy none() { return {}; }
  static Policy full();
  static Policy every(std::int64_t k);
  static Policy selective(std::vector<std::string> keep_ops = default_keep_ops());  // throws on a malformed entry
  static Policy budget(std::size_t bytes);

  // "none", "full", "every:K", "selective", "selective:op1,op2", "budget:SIZE" with SIZE in bytes or with a
  // KiB / MiB / GiB suffix ("budget:64MiB"). Each selective entry is op, op@label or @label
  // ("selective:scaled_dot_product_attention,linear@mlp.fc"). Throws memtrain::Error("ckpt::Policy", ...)
  // listing the forms, or naming the malformed entry.
  static Policy parse(std::string_view text);
  std::string to_string() const;  // parse(to_string()) == *this
  bool operator==(const Policy&) const = default;
};

// Recompute cost model of the budget planner, in FLOP-equivalents: the expensive ops' FLOPs, plus
// kFlopsPerSavedByte for each byte the cheap ops (memory-bound) produced and saved.
inline constexpr double kFlopsPerSavedByte = 8.0;

struct RegionCost {
  std::size_t kept_bytes = 0;  // saved activation bytes the region keeps until backward
  double recompute = 0;        // FLOP-equivalents a backward re-run costs
};
RegionCost region_cost(const RegionProfile& profile, RegionMode mode);

struct Plan {
  std::vector<RegionMode> modes;  // one per region (block)
  std::size_t budget_bytes = 0;
  std::size_t kept_bytes = 0;     // sum over regions, as planned
  double recompute = 0;
  bool feasible = true;           // false: even all-full keeps more than the budget (then all are full)
  std::string describe() const;   // one line per distinct mode run ("blocks 0-3: selective ..."), then totals
};

// Chooses a mode per region minimising total recompute with total kept_bytes <= budget_bytes.
Plan plan_budget(const std::vector<RegionProfile>& profiles, std::size_t budget_bytes);

// Runs the blocks of one model under a policy. budget: the first forward in grad mode runs every block as a
// full region while profiling it, then plans; later forwards follow the plan.
class BlockCheckpointer {
 public:
  explicit BlockCheckpointer(Policy policy = Policy::none()) : policy_(std::move(policy)) {}
  void set_policy(Policy policy);  // forgets any plan
  const Policy& policy() const { return policy_; }

  RegionMode mode_of(std::int64_t block, std::int64_t num_blocks) const;
  // block(x) for block `block` of `num_blocks`, plain or as a region, per the policy.
  Tensor run(std::int64_t block, std::int64_t num_blocks, const std::function<Tensor(const Tensor&)>& fn,
             const Tensor& x);

  const std::optional<Plan>& plan() const { return plan_; }  // budget only, once made
  // The policy and, per block, what it keeps ("selective: blocks 0-11 keep matmul, linear, ...").
  std::string describe(std::int64_t num_blocks) const;

 private:
  Policy policy_;
  std::vector<RegionProfile> profiles_;  // budget: filled by the profiling forward
  std::optional<Plan> plan_;
};

}  // namespace memtrain::ckpt
