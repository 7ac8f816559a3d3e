// all_gather, broadcast, the value gathers, all_reduce_sum, barrier, and the argument checks.
#include "dist_test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace mt = memtrain;
namespace dist = memtrain::dist;
using namespace memtrain::dist_test;
using ::testing::HasSubstr;

namespace {

// Runs f, which must throw memtrain::Error, and returns the message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const mt::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no memtrain::Error";
  return "";
}

}  // namespace

TEST(DistCollectives, AllGatherWithUnevenBoundsPutsEachRanksPartInPlace) {
  auto world = dist::world();
  const int size = world->size();
  std::vector<std::int64_t> bounds{0};
  for (int q = 0; q < size; ++q) bounds.push_back(bounds.back() + (q == 1 ? 0 : 5 * q + 2));  // rank 1: empty
  const std::int64_t numel = bounds.back();
  for (mt::DType dtype : {mt::DType::f32, mt::DType::bf16, mt::DType::i64}) {
    const mt::Tensor expected = leaf_tensor(3, 0, numel, dtype);
    const int me = world->rank();
    mt::Tensor mine = part(expected, bounds[me], bounds[me + 1]);
    mt::Tensor full = mt::zeros({numel}, dtype);
    world->all_gather(mine, bounds, full);
    EXPECT_TRUE(same_bits(full, expected)) << mt::dtype_name(dtype);
  }
}

TEST(DistCollectives, BroadcastCopiesRootsTensorOfAnyDtype) {
  auto world = dist::world();
  const int root = world->size() - 1;
  for (mt::DType dtype : {mt::DType::i64, mt::DType::f32, mt::DType::bf16}) {
    const mt::Tensor roots = leaf_tensor(11, root, 77, dtype);
    mt::Tensor t = world->rank() == root ? roots.clone() : mt::zeros({77}, dtype);
    world->broadcast(t, root);
    EXPECT_TRUE(same_bits(t, roots)) << mt::dtype_name(dtype);
  }
  const std::string text = world->broadcast_string(world->rank() == 0 ? "from rank 0" : "", 0);
  EXPECT_EQ(text, "from rank 0");
  EXPECT_EQ(world->broadcast_string(std::string(world->rank() == 0 ? 0 : 5, 'x'), 0), "");
}

TEST(DistCollectives, BroadcastRefusesAShapeUnlikeRootsOnEveryRank) {
  auto world = dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  mt::Tensor t = mt::zeros({world->rank() == 1 ? 4 : 3});
  EXPECT_THAT(error_of([&] { world->broadcast(t, 0); }),
              HasSubstr("broadcast: the tensor on rank 1 is unlike root 0's f32 [3]"));
  world->barrier();  // still usable
}

TEST(DistCollectives, ValueGathersAreRankByRank) {
  auto world = dist::world();
  const int me = world->rank();
  const std::vector<double> f = world->all_gather_f64({me + 0.5, -me - 0.25});
  const std::vector<std::int64_t> i = world->all_gather_i64({std::int64_t{1} << 40 | me});
  ASSERT_EQ(f.size(), 2u * world->size());
  ASSERT_EQ(i.size(), static_cast<std::size_t>(world->size()));
  for (int q = 0; q < world->size(); ++q) {
    EXPECT_EQ(f[2 * q], q + 0.5);
    EXPECT_EQ(f[2 * q + 1], -q - 0.25);
    EXPECT_EQ(i[q], std::int64_t{1} << 40 | q);
  }
  EXPECT_TRUE(world->all_gather_f64({}).empty());
}

TEST(DistCollectives, ValueGathersRefuseDifferentCountsNamingTheRank) {
  auto world = dist::world();
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::vector<double> mine(world->rank() == 1 ? 3 : 2, 1.0);
  const std::string message = error_of([&] { world->all_gather_f64(mine); });
  EXPECT_THAT(message, HasSubstr("all_gather_f64"));
  EXPECT_THAT(message, HasSubstr("rank 1 passes 3"));
  world->barrier();
}

TEST(DistCollectives, AllReduceSumMatchesTheExactSum) {
  auto world = dist::world();
  constexpr std::int64_t n = 4099;
  for (mt::DType dtype : {mt::DType::f32, mt::DType::f64, mt::DType::bf16}) {
    std::vector<mt::Tensor> leaves;
    for (int q = 0; q < world->size(); ++q) leaves.push_back(leaf_tensor(5, q, n, dtype, /*positive=*/true));
    mt::Tensor t = leaves[world->rank()].clone();
    world->all_reduce_sum(t);
    // MPI's order of summation is its own: positive terms, so a few roundings (then one to bf16) at most.
    const double tolerance = dtype == mt::DType::bf16 ? 1.0 / 128 : 1e-5;
    for (std::int64_t i = 0; i < n; ++i) {
      double exact = 0;
      for (const mt::Tensor& leaf : leaves) exact += element<double>(leaf, i);
      ASSERT_NEAR(element<double>(t, i), exact, tolerance * exact) << mt::dtype_name(dtype) << " element " << i;
    }
  }
}

TEST(DistCollectives, ArgumentErrorsNameTheOperation) {
  auto world = dist::world();
  const int size = world->size();
  const int me = world->rank();
  const std::vector<std::int64_t> bounds = dist::shard_bounds(64, size, 1);
  const std::int64_t my_numel = bounds[me + 1] - bounds[me];
  mt::Tensor full = mt::zeros({64});
  mt::Tensor mine = mt::zeros({my_numel});
  auto reduce_scatter = [&](const mt::Tensor& c, const std::vector<std::int64_t>& b, mt::Tensor& m) {
    return error_of([&] { world->reduce_scatter_canonical(c, b, m); });
  };
  mt::Tensor too_long = mt::zeros({my_numel + 1});
  EXPECT_THAT(reduce_scatter(full, bounds, too_long), HasSubstr("reduce_scatter_canonical: mine has"));
  std::vector<std::int64_t> short_bounds(bounds.begin(), bounds.end() - 1);
  EXPECT_THAT(reduce_scatter(full, short_bounds, mine), HasSubstr("reduce_scatter_canonical: bounds has"));
  std::vector<std::int64_t> past_end = bounds;
  past_end.back() = 65;
  EXPECT_THAT(reduce_scatter(full, past_end, mine), HasSubstr("must run from 0 to"));
  if (size >= 2) {
    std::vector<std::int64_t> decreasing = bounds;
    decreasing[1] = 70;  // past bounds[2] <= 64
    EXPECT_THAT(reduce_scatter(full, decreasing, mine), HasSubstr("reduce_scatter_canonical: bounds decrease"));
  }
  mt::Tensor mine_f64 = mt::zeros({my_numel}, mt::DType::f64);
  EXPECT_THAT(reduce_scatter(full, bounds, mine_f64), HasSubstr("mine is f64 but the full tensor is f32"));
  mt::Tensor ints = mt::zeros({64}, mt::DType::i32);
  mt::Tensor mine_ints = mt::zeros({my_numel}, mt::DType::i32);
  EXPECT_THAT(reduce_scatter(ints, bounds, mine_ints), HasSubstr("reduce_scatter_canonical: cannot sum i32"));
  mt::Tensor matrix = mt::zeros({8, 8});
  mt::Tensor transposed = matrix.t();
  EXPECT_THAT(error_of([&] { world->all_reduce_sum(transposed); }),
              HasSubstr("all_reduce_sum: the tensor (shape [8, 8]) is not contiguous"));
  EXPECT_THAT(error_of([&] { world->all_reduce_sum(ints); }), HasSubstr("all_reduce_sum: cannot sum i32"));
  EXPECT_THAT(error_of([&] { world->all_gather(mine, short_bounds, full); }), HasSubstr("all_gather: bounds has"));
  EXPECT_THAT(error_of([&] { world->broadcast(full, size); }), HasSubstr("broadcast: root"));
  EXPECT_THAT(error_of([&] { world->broadcast_string("x", -1); }), HasSubstr("broadcast_string: root -1"));
  mt::Tensor meta = mt::Tensor::empty({4}, mt::DType::f32, mt::Device::meta());
  EXPECT_THAT(error_of([&] { world->all_reduce_sum(meta); }), HasSubstr("all_reduce_sum: the tensor is on meta"));
  EXPECT_THAT(error_of([&] { world->set_timeout_seconds(0); }), HasSubstr("set_timeout_seconds"));
  world->barrier();  // every check ran before any message: the group is still in step
}

// Point to point (pipeline stages): two messages with one tag arrive whole and in the order they were sent (at 3
// ranks in 64-byte chunks, MEMTRAIN_DIST_CHUNK_BYTES); the peer and the tag are checked; a group of one refuses.
TEST(DistCollectives, PointToPointMessagesArriveWholeAndInOrder) {
  auto world = dist::world();
  const int tag = dist::Communicator::kFirstUserTag;
  mt::Tensor a = leaf_tensor(21, world->rank(), 1000, mt::DType::f32);
  if (world->size() < 2) {
    EXPECT_THAT(error_of([&] { world->send(a, 0, tag); }),
                HasSubstr("sends no point-to-point messages"));
    return;
  }
  const int next = (world->rank() + 1) % world->size(), prev = (world->rank() + world->size() - 1) % world->size();
  const mt::Tensor b = leaf_tensor(22, world->rank(), 37, mt::DType::bf16);
  auto first = world->send(a, next, tag);
  auto second = world->send(b, next, tag);
  mt::Tensor got_a = mt::Tensor::empty({1000}, mt::DType::f32), got_b = mt::Tensor::empty({37}, mt::DType::bf16);
  world->recv(got_a, prev, tag);
  world->recv(got_b, prev, tag);
  first->wait();
  EXPECT_TRUE(second->test() || (second->wait(), true));
  EXPECT_TRUE(same_bits(got_a, leaf_tensor(21, prev, 1000, mt::DType::f32)));
  EXPECT_TRUE(same_bits(got_b, leaf_tensor(22, prev, 37, mt::DType::bf16)));
  EXPECT_THAT(error_of([&] { world->send(a, world->rank(), tag); }),
              HasSubstr("is not another rank of this group"));
  EXPECT_THAT(error_of([&] { world->recv(got_a, next, 5); }), HasSubstr("tag 5 is below"));
  world->barrier();
}

// split: the ranks of one color form a group ranked by key; its sums and gathers see only its members, and its
// messages never meet the parent's (a collective on the parent between two on the sub-groups still matches).
TEST(DistCollectives, SplitMakesIndependentSubGroupsRankedByKey) {
  auto world = mt::dist::world();
  const int r = world->rank(), n = world->size();
  // Odd and even ranks, each group ranked from its highest world rank down.
  auto group = world->split(r % 2, n - r);
  const int members = (n - r % 2 + 1) / 2;
  ASSERT_EQ(group->size(), members);
  int higher_same_parity = 0;
  for (int q = r + 2; q < n; q += 2) ++higher_same_parity;
  EXPECT_EQ(group->rank(), higher_same_parity);
  EXPECT_EQ(group->timeout_seconds(), world->timeout_seconds());
  mt::Tensor t = mt::full({5}, static_cast<double>(r + 1), mt::DType::f32);
  group->all_reduce_canonical(t);
  double want = 0.0;
  for (int q = r % 2; q < n; q += 2) want += q + 1;
  EXPECT_EQ(t.data<float>()[0], static_cast<float>(want));
  // The parent's collective in between, then the group's gather: each in its own space.
  const std::vector<std::int64_t> all = world->all_gather_i64({r});
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  const std::vector<std::int64_t> mine = group->all_gather_i64({r});
  ASSERT_EQ(mine.size(), static_cast<std::size_t>(members));
  for (std::size_t k = 0; k < mine.size(); ++k) {
    EXPECT_EQ(mine[k] % 2, r % 2);
    if (k > 0) EXPECT_GT(mine[k - 1], mine[k]) << "ranked by key: the highest world rank first";
  }
  // A group of one splits into a group of one.
  EXPECT_EQ(mt::dist::single_process()->split(3, 0)->size(), 1);
}
