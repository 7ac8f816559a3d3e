// main() of memtrain_dist_tests: joins dist::world() first (MPI is initialised there under a launcher, or the
// group is this process alone). Only rank 0 prints GoogleTest's report; every rank prints its own failures, and
// a failure on any rank fails its exit status, which fails mpirun.
#include "memtrain/dist/communicator.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const auto world = memtrain::dist::world();
  std::printf("memtrain_dist_tests: rank %d of %d (%s)\n", world->rank(), world->size(), world->backend().c_str());
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world->rank()));
  }
  return RUN_ALL_TESTS();
}
