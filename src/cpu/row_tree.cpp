#include "cpu/row_tree.h"

#include "memtrain/core/error.h"

#include <algorithm>
#include <bit>

namespace memtrain::cpu {
namespace {

std::int64_t split(std::int64_t n) { return static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(n - 1))); }

// `scratch` holds one width-long buffer per level below this one.
void sum_into(std::int64_t lo, std::int64_t hi, std::int64_t width, const RowLeaf& leaf, double* out,
              double* scratch) {
  if (hi - lo == 1) {
    leaf(lo, out);
    return;
  }
  const std::int64_t mid = lo + split(hi - lo);
  sum_into(lo, mid, width, leaf, out, scratch);
  sum_into(mid, hi, width, leaf, scratch, scratch + width);
  for (std::int64_t k = 0; k < width; ++k) out[k] += scratch[k];
}

}  // namespace

void row_tree_sum(std::int64_t lo, std::int64_t hi, std::int64_t width, const RowLeaf& leaf, double* out) {
  MT_CHECK(hi > lo && width >= 0, "row_tree_sum", "rows [{}, {}) with width {}", lo, hi, width);
  // The right halves of one root-to-leaf path: at most one buffer per level (64 levels bound any row count).
  std::vector<double> scratch(static_cast<std::size_t>(width) * 64);
  sum_into(lo, hi, width, leaf, out, scratch.data());
}

std::vector<RowNode> row_tree_cover(std::int64_t lo, std::int64_t hi, std::int64_t a, std::int64_t b) {
  std::vector<RowNode> nodes;
  const std::function<void(std::int64_t, std::int64_t)> visit = [&](std::int64_t l, std::int64_t h) {
    if (h <= a || l >= b) return;
    if (l >= a && h <= b) {
      nodes.push_back({l, h});
      return;
    }
    const std::int64_t mid = l + split(h - l);
    visit(l, mid);
    visit(mid, h);
  };
  if (hi > lo) visit(lo, hi);
  return nodes;
}

void row_tree_combine(std::int64_t lo, std::int64_t hi, std::int64_t width,
                      const std::function<const double*(RowNode)>& value, double* out) {
  if (const double* v = value({lo, hi})) {
    std::copy_n(v, width, out);
    return;
  }
  MT_CHECK(hi - lo > 1, "row_tree_combine", "no rank's sum covers row {}", lo);
  const std::int64_t mid = lo + split(hi - lo);
  row_tree_combine(lo, mid, width, value, out);
  std::vector<double> right(static_cast<std::size_t>(width));
  row_tree_combine(mid, hi, width, value, right.data());
  for (std::int64_t k = 0; k < width; ++k) out[k] += right[k];
}

}  // namespace memtrain::cpu
