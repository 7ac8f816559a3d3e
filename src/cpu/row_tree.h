// A sum over the rows of a matrix in one fixed pairwise tree, so that processes holding different ranges of
// the rows reach the same bits as one process holding them all (Adafactor's statistics under ZeRO).
//
// The tree over rows [lo, hi): one row is a leaf; more split at lo + p, p the largest power of two strictly
// below hi - lo (dist::canonical_split's rule), and add (left) + (right) element by element in double. A rank
// holding rows [a, b) sums the maximal nodes inside its range (row_tree_cover); with every rank's node values,
// row_tree_combine evaluates the root with the same additions in the same order as row_tree_sum.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace memtrain::cpu {

struct RowNode {
  std::int64_t lo = 0, hi = 0;  // rows [lo, hi)
};

// Writes row `row`'s `width` leaf values to `out`.
using RowLeaf = std::function<void(std::int64_t row, double* out)>;

// out[0, width) := the tree over rows [lo, hi) (hi > lo).
void row_tree_sum(std::int64_t lo, std::int64_t hi, std::int64_t width, const RowLeaf& leaf, double* out);

// The maximal nodes of the tree over [lo, hi) that lie inside [a, b), left to right (none when they do not
// meet): whole subtrees a rank can sum alone.
std::vector<RowNode> row_tree_cover(std::int64_t lo, std::int64_t hi, std::int64_t a, std::int64_t b);

// out[0, width) := the tree over [lo, hi), from `value(node)`: the node's sum when some rank's cover holds it,
// else nullptr (then its two halves are asked). Throws naming a row no node covers.
void row_tree_combine(std::int64_t lo, std::int64_t hi, std::int64_t width,
                      const std::function<const double*(RowNode)>& value, double* out);

}  // namespace memtrain::cpu
