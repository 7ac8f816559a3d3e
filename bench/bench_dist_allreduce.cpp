// The cost of the canonical all-reduce (point-to-point reduce-scatter in a fixed tree + all-gather) against MPI's
// own (all_reduce_sum, MPI_Iallreduce), on f32 tensors of 1 MiB and 16 MiB. Run under a launcher, e.g.
//   mpirun --allow-run-as-root -np 2 build/bench/bench_dist_allreduce [iterations]
// Each iteration starts at a barrier and counts the slowest rank's time; rank 0 prints the median.
#include "memtrain/dist/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

namespace dist = memtrain::dist;

double median_seconds(dist::Communicator& world, int iterations, memtrain::Tensor& t, bool canonical) {
  std::vector<double> slowest;
  for (int i = 0; i < iterations; ++i) {
    world.barrier();
    const auto start = std::chrono::steady_clock::now();
    if (canonical) {
      world.all_reduce_canonical(t);
    } else {
      world.all_reduce_sum(t);
    }
    const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::vector<double> all = world.all_gather_f64({mine});
    slowest.push_back(*std::max_element(all.begin(), all.end()));
  }
  std::nth_element(slowest.begin(), slowest.begin() + iterations / 2, slowest.end());
  return slowest[static_cast<std::size_t>(iterations / 2)];
}

}  // namespace

int main(int argc, char** argv) try {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 21;
  auto world = dist::world();
  if (world->rank() == 0) std::printf("ranks %d (%s), median of %d\n", world->size(), world->backend().c_str(), iterations);
  for (std::int64_t mib : {1, 16}) {
    memtrain::Tensor t = memtrain::full({mib << 18}, 1.0);  // f32: 2^18 elements per MiB
    const double canonical = median_seconds(*world, iterations, t, true);
    const double library = median_seconds(*world, iterations, t, false);
    if (world->rank() == 0) {
      std::printf("%2lld MiB f32: all_reduce_canonical %8.3f ms   all_reduce_sum (MPI) %8.3f ms   ratio %.2f\n",
                  static_cast<long long>(mib), canonical * 1e3, library * 1e3, canonical / library);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_dist_allreduce: %s\n", e.what());
  return 1;
}
