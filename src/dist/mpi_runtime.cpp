// MPI_Init_thread / MPI_Finalize / MPI_Abort, and the requests abandoned by timed-out operations.
#include "dist/mpi_runtime.h"

#include "dist/mpi_backend.h"
#include "memtrain/core/error.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace memtrain::dist::detail {
namespace {

struct ParkedOperation {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  std::vector<std::shared_ptr<const void>> buffers;
};

// Never destroyed: finalize_at_exit runs after the static objects built since MPI_Init are gone, and the
// parked buffers (tensor storage among them) must not be freed that late, when the allocator may be gone too.
std::mutex& parked_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<ParkedOperation>& parked() {
  static auto* operations = new std::vector<ParkedOperation>;
  return *operations;
}

bool all_complete(ParkedOperation& op) {
  int done = 0;
  MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &done, MPI_STATUSES_IGNORE);
  return done != 0;
}

// Receives can be cancelled; collectives cannot, and a send may be already on its way. The operations stay in
// the list (see parked()).
bool cancel_parked_and_wait(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (ParkedOperation& op : parked()) {
    if (all_complete(op)) continue;
    for (std::size_t i = 0; i < op.requests.size(); ++i) {
      if (op.requests[i] != MPI_REQUEST_NULL && op.peers[i] >= 0) MPI_Cancel(&op.requests[i]);
    }
  }
  while (!std::all_of(parked().begin(), parked().end(), all_complete)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  std::lock_guard lock(parked_mutex());
  // MPI_Finalize with operations still pending may wait forever for a peer that never comes; an exit without
  // it makes the launcher report the run as failed, which it is.
  if (!cancel_parked_and_wait(1.0)) {
    std::fprintf(stderr,
                 "memtrain: dist: not finalising MPI: an operation that timed out is still waiting for a peer\n");
    return;
  }
  MPI_Finalize();
}

}  // namespace

int init_mpi_once() {
  static const int provided = [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int level = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&level);  // someone else's MPI: theirs to finalise
    } else {
      MT_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &level) == MPI_SUCCESS, "dist::world",
               "MPI_Init_thread failed");
      std::atexit(finalize_at_exit);
    }
    MT_CHECK(level >= MPI_THREAD_SERIALIZED, "dist::world",
             "the MPI library provides thread level {}; memtrain needs MPI_THREAD_SERIALIZED or higher", level);
    return level;
  }();
  return provided;
}

void park_requests(std::vector<MPI_Request> requests, std::vector<int> peers,
                   std::vector<std::shared_ptr<const void>> buffers) {
  std::lock_guard lock(parked_mutex());
  parked().push_back({std::move(requests), std::move(peers), std::move(buffers)});
}

void reap_parked_requests() {
  std::lock_guard lock(parked_mutex());
  std::erase_if(parked(), all_complete);
}

void abort_mpi_if_running(int code) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace memtrain::dist::detail
