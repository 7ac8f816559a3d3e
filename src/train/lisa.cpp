#include "train/lisa.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <numeric>
#include <random>

namespace memtrain::train::detail {

namespace {

// "h.3.attn.c_attn.weight" -> "h.3"; "" for a name with no all-digit component.
std::string block_of(const std::string& name) {
  std::size_t start = 0;
  while (start < name.size()) {
    const std::size_t dot = std::min(name.find('.', start), name.size());
    const bool digits = dot > start && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(start),
                                                   name.begin() + static_cast<std::ptrdiff_t>(dot),
                                                   [](unsigned char c) { return std::isdigit(c) != 0; });
    if (digits) return name.substr(0, dot);
    start = dot + 1;
  }
  return "";
}

}  // namespace

Lisa::Lisa(const nn::Module& model, std::int64_t active_blocks, std::int64_t interval, std::uint64_t seed,
           DType frozen_dtype)
    : frozen_dtype_(frozen_dtype), active_blocks_(active_blocks), interval_(interval), seed_(seed) {
  const char* where = "Trainer (LISA)";
  std::map<std::string, std::size_t> index;
  for (const auto& [name, p] : model.named_parameters()) {
    const std::string block = block_of(name);
    if (block.empty()) continue;  // always trained
    const auto [it, inserted] = index.emplace(block, names_.size());
    if (inserted) {
      names_.push_back(block);
      blocks_.emplace_back();
      master_dtypes_.emplace_back();
    }
    blocks_[it->second].push_back(p);
    master_dtypes_[it->second].push_back(p.dtype());
  }
  MT_CHECK(!names_.empty(), where, "lisa_layers {}: the model has no numbered blocks (parameters named like "
           "\"h.3.attn.c_attn.weight\") to sample from", active_blocks);
  MT_CHECK(active_blocks >= 1 && active_blocks <= static_cast<std::int64_t>(names_.size()), where,
           "lisa_layers must be in [1, {}] (the model's blocks), got {}", names_.size(), active_blocks);
  MT_CHECK(interval >= 1, where, "lisa_interval must be >= 1, got {}", interval);
}

std::vector<std::int64_t> Lisa::draw(std::int64_t period) const {
  std::vector<std::int64_t> order(names_.size());
  std::iota(order.begin(), order.end(), 0);
  // A fresh engine per period from (seed, period), so a draw never depends on the draws before it.
  std::seed_seq seq{static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32),
                    static_cast<std::uint32_t>(period), static_cast<std::uint32_t>(period >> 32), 0x4c495341u};
  std::mt19937_64 rng(seq);
  const auto n = static_cast<std::int64_t>(order.size());
  for (std::int64_t i = 0; i < active_blocks_; ++i) {
    // Fisher-Yates: the i-th pick is uniform over the ones not picked yet. The bound's modulo bias is below
    // n / 2^64, far under anything a test or a run could see.
    const std::int64_t j = i + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n - i));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  std::vector<std::int64_t> picked(order.begin(), order.begin() + active_blocks_);
  std::sort(picked.begin(), picked.end());
  return picked;
}

bool Lisa::before_step(std::int64_t step, optim::Optimizer& optimizer) {
  const std::int64_t period = step / interval_;
  if (period == period_) return false;
  period_ = period;
  const std::vector<std::int64_t> next = draw(period);
  const bool changed = next != active_;
  active_ = next;
  std::vector<bool> on(blocks_.size(), false);
  for (const std::int64_t b : active_) on[static_cast<std::size_t>(b)] = true;
  CategoryGuard category(MemoryCategory::parameters);
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    for (std::size_t i = 0; i < blocks_[b].size(); ++i) {
      Tensor& p = blocks_[b][i];
      const DType dtype = on[b] ? master_dtypes_[b][i] : frozen_dtype_;
      if (p.dtype() != dtype) p.set_data_and_dtype_(p.detach().to(dtype));
      if (on[b]) {
        p.set_requires_grad(true);
        continue;
      }
      // A block that was active (or whose state a checkpoint brought) lets its state go now.
      p.set_requires_grad(false);
      p.set_grad(Tensor());
      optimizer.reset_state(p);
    }
  }
  return changed;
}

}  // namespace memtrain::train::detail
