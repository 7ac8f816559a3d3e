// reduce_scatter_canonical and all_reduce_canonical against the canonical tree evaluated serially: every rank
// generates every rank's contribution from a seed, so each can compute the expected bits itself.
#include "dist_test_util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mt = memtrain;
namespace dist = memtrain::dist;
using namespace memtrain::dist_test;

namespace {

// Every rank's part is non-empty except rank 0's (and, at 4 ranks, rank 2's): uneven, with empty parts.
std::vector<std::int64_t> uneven_bounds(int size) {
  std::vector<std::int64_t> bounds{0};
  for (int q = 0; q < size; ++q) bounds.push_back(bounds.back() + (q % 2 == 0 ? 0 : 7 * q + 3));
  bounds.back() += 5;  // the last part also takes a few more
  return bounds;
}

void expect_reduce_scatter_is_the_serial_tree(mt::DType dtype, const std::vector<std::int64_t>& bounds) {
  auto world = dist::world();
  const int size = world->size();
  const int me = world->rank();
  const std::int64_t numel = bounds.back();
  std::vector<mt::Tensor> leaves;
  for (int q = 0; q < size; ++q) leaves.push_back(leaf_tensor(42, q, numel, dtype));
  mt::Tensor mine = mt::Tensor::empty({bounds[me + 1] - bounds[me]}, dtype);
  world->reduce_scatter_canonical(leaves[me], bounds, mine);
  const mt::Tensor expected = serial_canonical_sum(leaves, bounds[me], bounds[me + 1]);
  EXPECT_TRUE(same_bits(mine, expected)) << mt::dtype_name(dtype) << " rank " << me << " of " << size;
}

}  // namespace

TEST(DistCanonicalSum, ReduceScatterIsBitIdenticalToTheSerialTree) {
  for (mt::DType dtype : {mt::DType::f32, mt::DType::f64, mt::DType::bf16, mt::DType::f16}) {
    const int size = dist::world()->size();
    expect_reduce_scatter_is_the_serial_tree(dtype, dist::shard_bounds(5000, size, 256));
    expect_reduce_scatter_is_the_serial_tree(dtype, uneven_bounds(size));
    expect_reduce_scatter_is_the_serial_tree(dtype, dist::shard_bounds(3, size, 1));  // numel < size: empty parts
  }
}

TEST(DistCanonicalSum, AllReduceIsBitIdenticalToTheSerialTreeAndCloseToTheExactSum) {
  auto world = dist::world();
  constexpr std::int64_t n = 3001;
  for (mt::DType dtype : {mt::DType::f32, mt::DType::f64, mt::DType::bf16}) {
    std::vector<mt::Tensor> leaves;
    for (int q = 0; q < world->size(); ++q) leaves.push_back(leaf_tensor(7, q, n, dtype, /*positive=*/true));
    mt::Tensor t = leaves[world->rank()].clone();
    world->all_reduce_canonical(t);
    EXPECT_TRUE(same_bits(t, serial_canonical_sum(leaves, 0, n))) << mt::dtype_name(dtype);
    // Positive terms: the tree's error is a few roundings of the accumulation type (then one to bf16).
    const double tolerance = dtype == mt::DType::bf16 ? 1.0 / 128 : 1e-5;
    for (std::int64_t i = 0; i < n; ++i) {
      double exact = 0;
      for (const mt::Tensor& leaf : leaves) exact += element<double>(leaf, i);
      ASSERT_NEAR(element<double>(t, i), exact, tolerance * exact) << mt::dtype_name(dtype) << " element " << i;
    }
  }
}

// The promise of communicator.h: with 4 leaves, each rank contributing the tree of its block of 4 / size leaves
// gives the tree over all 4 leaves, at 1, 2 or 4 ranks alike.
TEST(DistCanonicalSum, RanksOfLocalTreesGiveTheTreeOverAllLeaves) {
  auto world = dist::world();
  const int size = world->size();
  if (4 % size != 0) GTEST_SKIP() << "needs 1, 2 or 4 ranks";
  constexpr int kLeaves = 4;
  constexpr std::int64_t n = 2000;
  const int per_rank = kLeaves / size;
  for (mt::DType dtype : {mt::DType::f32, mt::DType::f64}) {
    std::vector<mt::Tensor> leaves;
    for (int l = 0; l < kLeaves; ++l) leaves.push_back(leaf_tensor(99, l, n, dtype));
    const std::vector<mt::Tensor> my_block(leaves.begin() + world->rank() * per_rank,
                                           leaves.begin() + (world->rank() + 1) * per_rank);
    mt::Tensor t = serial_canonical_sum(my_block, 0, n);
    world->all_reduce_canonical(t);
    EXPECT_TRUE(same_bits(t, serial_canonical_sum(leaves, 0, n))) << mt::dtype_name(dtype);
  }
}
