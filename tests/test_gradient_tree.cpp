// train::detail::GradientTree sums micro-batch gradients in the canonical tree order: for 1..9 leaves its
// result equals, bit for bit, the tree evaluated recursively from its definition (split at the largest power
// of two below n) in float, and a block of 2^k leaves summed first and then combined with the others by the
// same rule gives the same bits (what makes data-parallel runs agree across world sizes). A leaf without a
// gradient counts as zero, and at most floor(log2(n)) + 1 gradient sets are alive.
#include "train/gradient_tree.h"

#include "memtrain/core/allocator.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

namespace mt = memtrain;
using mt::Tensor;

namespace {

constexpr std::int64_t kElems = 257;

// Leaf i's gradient: values of very different magnitudes, so the summation order shows in the bits.
std::vector<float> leaf_values(std::int64_t leaf) {
  std::vector<float> v(kElems);
  for (std::int64_t e = 0; e < kElems; ++e) {
    const double scale = std::ldexp(1.0, static_cast<int>((leaf * 7 + e * 3) % 40) - 20);
    v[static_cast<std::size_t>(e)] = static_cast<float>(scale * std::sin(1.3 * leaf + 0.7 * e + 0.1));
  }
  return v;
}

// The definition: tree over [lo, lo + n) = tree(first p) + tree(rest), p the largest power of two below n.
std::vector<float> reference_tree(std::int64_t lo, std::int64_t n) {
  if (n == 1) return leaf_values(lo);
  const auto p = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(n - 1)));
  std::vector<float> left = reference_tree(lo, p);
  const std::vector<float> right = reference_tree(lo + p, n - p);
  for (std::size_t e = 0; e < left.size(); ++e) left[e] = left[e] + right[e];
  return left;
}

std::vector<float> grad_values(const Tensor& p) {
  return {p.grad().data<float>(), p.grad().data<float>() + p.grad().numel()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs `n` leaves from `first` through a tree over one parameter; returns the folded gradient.
std::vector<float> tree_sum(std::int64_t first, std::int64_t n, std::size_t* most_alive = nullptr) {
  Tensor p = mt::zeros({kElems});
  p.set_requires_grad(true);
  mt::train::detail::GradientTree tree({p});
  mt::Allocator& cpu = mt::Allocator::get(mt::Device::cpu());
  const std::size_t before = cpu.stats()[mt::MemoryCategory::gradients].live_bytes;
  std::size_t alive = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    mt::CategoryGuard category(mt::MemoryCategory::gradients);
    p.set_grad(mt::tensor(leaf_values(first + i), {kElems}));
    tree.push_leaf();
    EXPECT_FALSE(p.grad().defined()) << "the leaf must take the gradient out of .grad";
    alive = std::max(alive, cpu.stats()[mt::MemoryCategory::gradients].live_bytes - before);
  }
  tree.finish();
  if (most_alive) *most_alive = alive;
  return grad_values(p);
}

}  // namespace

TEST(GradientTree, EqualsTheCanonicalTreeBitForBit) {
  for (std::int64_t n = 1; n <= 9; ++n) {
    std::size_t alive = 0;
    EXPECT_TRUE(same_bits(tree_sum(0, n, &alive), reference_tree(0, n))) << n << " leaves";
    const std::size_t sets = static_cast<std::size_t>(std::bit_width(static_cast<std::uint64_t>(n)));
    EXPECT_LE(alive, sets * kElems * sizeof(float)) << n << " leaves";
  }
  // The order matters at all for these values: a sequential sum of 8 leaves differs from the tree.
  std::vector<float> sequential = leaf_values(0);
  for (std::int64_t i = 1; i < 8; ++i) {
    const std::vector<float> l = leaf_values(i);
    for (std::size_t e = 0; e < l.size(); ++e) sequential[e] = sequential[e] + l[e];
  }
  EXPECT_FALSE(same_bits(sequential, reference_tree(0, 8)));
}

// Blocks of 2^k leaves (one rank's micro-batches), each summed by its own tree, then the block sums combined
// by the canonical rule over blocks: the tree over all leaves, for 1, 2 and 4 blocks of 8 leaves.
TEST(GradientTree, BlocksOfPowersOfTwoComposeIntoTheGlobalTree) {
  const std::vector<float> global = reference_tree(0, 8);
  for (const std::int64_t blocks : {1, 2, 4}) {
    const std::int64_t per = 8 / blocks;
    std::vector<std::vector<float>> sums;
    for (std::int64_t b = 0; b < blocks; ++b) sums.push_back(tree_sum(b * per, per));
    // The canonical rule over equal power-of-two blocks is a pairwise tree.
    while (sums.size() > 1) {
      std::vector<std::vector<float>> next;
      for (std::size_t i = 0; i < sums.size(); i += 2) {
        std::vector<float> s = sums[i];
        for (std::size_t e = 0; e < s.size(); ++e) s[e] = s[e] + sums[i + 1][e];
        next.push_back(s);
      }
      sums = next;
    }
    EXPECT_TRUE(same_bits(sums[0], global)) << blocks << " blocks";
  }
}

TEST(GradientTree, ALeafWithoutAGradientCountsAsZero) {
  Tensor p = mt::zeros({kElems});
  p.set_requires_grad(true);
  mt::train::detail::GradientTree tree({p});
  tree.push_leaf();  // no gradient: an unused parameter, or a micro-batch without targets
  p.set_grad(mt::tensor(leaf_values(5), {kElems}));
  tree.push_leaf();
  tree.push_leaf();
  tree.finish();
  EXPECT_TRUE(same_bits(grad_values(p), leaf_values(5)));
  mt::train::detail::GradientTree none({p});
  p.set_grad(Tensor());
  none.push_leaf();
  none.finish();
  EXPECT_FALSE(p.grad().defined());
}

// complete() folds one parameter ahead of the others (what the data-parallel hooks do during the last
// backward): that parameter's result is the tree's, bit for bit, and push_leaf/finish then fold only the
// rest, for 1..9 leaves.
TEST(GradientTree, CompletingOneParameterEarlyGivesTheSameSum) {
  for (std::int64_t n = 1; n <= 9; ++n) {
    Tensor early = mt::zeros({kElems}), late = mt::zeros({kElems});
    early.set_requires_grad(true);
    late.set_requires_grad(true);
    mt::train::detail::GradientTree tree({early, late});
    for (std::int64_t i = 0; i < n; ++i) {
      early.set_grad(mt::tensor(leaf_values(i), {kElems}));
      late.set_grad(mt::tensor(leaf_values(i + 1), {kElems}));
      if (i + 1 == n) tree.complete(0);  // from its hook, before the leaf is pushed
      tree.push_leaf();
    }
    ASSERT_TRUE(early.grad().defined()) << n;
    EXPECT_FALSE(late.grad().defined()) << "push_leaf must still take the other parameter's gradient";
    tree.finish();
    EXPECT_TRUE(same_bits(grad_values(early), reference_tree(0, n))) << n << " leaves";
    EXPECT_TRUE(same_bits(grad_values(late), reference_tree(1, n))) << n << " leaves";
  }
}
