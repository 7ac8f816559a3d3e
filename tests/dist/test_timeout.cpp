// A peer that does not answer: PeerTimeout names it within the timeout, and when the peer joins the operation
// late, its messages go to the abandoned operation and the group is usable again. Run by its own ctest
// (dist_timeout_np2), since a failure here could leave the group out of step for the tests after it.
#include "dist_test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace mt = memtrain;
namespace dist = memtrain::dist;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kShortTimeout = 1.0;
constexpr auto kLate = std::chrono::milliseconds(2500);  // rank 1 joins after the others gave up

// Rank 1 joins `op` late (with a long timeout); every other rank expects PeerTimeout naming rank 1 in about
// kShortTimeout seconds. Then everyone meets at a barrier and checks an all-reduce.
template <typename Op>
void expect_timeout_naming_rank_one(const char* expected_message, Op&& op) {
  auto world = dist::world();
  const double saved = world->timeout_seconds();
  if (world->rank() == 1) {
    std::this_thread::sleep_for(kLate);
    op(*world);
  } else {
    world->set_timeout_seconds(kShortTimeout);
    const auto start = Clock::now();
    try {
      op(*world);
      ADD_FAILURE() << "no PeerTimeout";
    } catch (const dist::PeerTimeout& e) {
      EXPECT_THAT(e.what(), HasSubstr(fmt::format(fmt::runtime(expected_message), world->rank(), world->size())));
    }
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_GE(waited, kShortTimeout);
    EXPECT_LT(waited, kShortTimeout + 2.0);
  }
  world->set_timeout_seconds(saved);
  world->barrier();
  mt::Tensor t = mt::full({1000}, 1.0);
  world->all_reduce_canonical(t);
  EXPECT_EQ(t.data<float>()[999], static_cast<float>(world->size()));
}

}  // namespace

TEST(DistTimeout, PointToPointNamesTheSilentPeer) {
  if (dist::world()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_timeout_naming_rank_one("reduce_scatter_canonical: rank {} of {} waited 1 s for rank 1 (dead or stuck?)",
                                 [](dist::Communicator& c) {
                                   // Not all_reduce_canonical: rank 1 would then wait in its all_gather for
                                   // ranks that gave up before theirs.
                                   const mt::Tensor t = mt::full({64}, 2.0);
                                   const auto bounds = dist::shard_bounds(64, c.size(), 1);
                                   mt::Tensor mine = mt::Tensor::empty({bounds[c.rank() + 1] - bounds[c.rank()]});
                                   c.reduce_scatter_canonical(t, bounds, mine);
                                 });
}

TEST(DistTimeout, CollectiveSaysItWaitedForTheOthers) {
  if (dist::world()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_timeout_naming_rank_one("barrier: rank {} of {} waited 1 s for the other ranks",
                                 [](dist::Communicator& c) { c.barrier(); });
}

// A pipeline stage waiting for its neighbour's activations: recv names the silent sender.
TEST(DistTimeout, ReceiveNamesTheSilentSender) {
  if (dist::world()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto exchange = [](dist::Communicator& c) {
    mt::Tensor t = mt::full({64}, 3.0);
    const int tag = dist::Communicator::kFirstUserTag;
    if (c.rank() == 1) {
      for (int q = 0; q < c.size(); ++q)
        if (q != 1) c.send(t, q, tag)->wait();  // late: into the receives the others abandoned
    } else {
      c.recv(t, 1, tag);
    }
  };
  expect_timeout_naming_rank_one("recv: rank {} of {} waited 1 s for rank 1 (dead or stuck?)", exchange);
}
