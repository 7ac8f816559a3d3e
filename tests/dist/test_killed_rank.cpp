// Half of the killed-rank check (tests/dist/killed_rank.sh): rank 1 dies by SIGKILL while rank 0 waits for it in
// a collective. Skipped unless that script runs it (MEMTRAIN_DIST_KILL_TEST=1); the script expects the
// launcher to end the run with a failure naming rank 1, within its time limit.
#include "memtrain/dist/communicator.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace mt = memtrain;
namespace dist = memtrain::dist;

TEST(DistKilledRank, RankOneDiesMidCollective) {
  if (std::getenv("MEMTRAIN_DIST_KILL_TEST") == nullptr) GTEST_SKIP() << "run by tests/dist/killed_rank.sh";
  auto world = dist::world();
  ASSERT_GE(world->size(), 2);
  world->barrier();
  if (world->rank() == 1) std::raise(SIGKILL);
  world->set_timeout_seconds(20);
  mt::Tensor t = mt::full({1 << 16}, 1.0);
  try {
    world->all_reduce_canonical(t);
  } catch (const dist::PeerTimeout& e) {
    // Reached only if the launcher has not already ended the run: the caller's part is to end it.
    std::fprintf(stderr, "%s\n", e.what());
    dist::abort_world(3);
  }
  ADD_FAILURE() << "the collective completed without rank 1";
}
