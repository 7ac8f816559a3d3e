// The MPI library's lifetime in this process, and the requests that timed-out operations left behind.
// Private to the MPI backend (built only with MEMTRAIN_HAVE_MPI).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

namespace memtrain::dist::detail {

// Initialises MPI once per process (MPI_Init_thread asking for MPI_THREAD_MULTIPLE; SERIALIZED or higher is
// accepted, since the communicator serialises its own calls) and finalises it at exit, unless MPI was already
// initialised by someone else. Returns the thread level MPI provides.
int init_mpi_once();

// Keeps the requests of an operation that timed out, with the buffers they read or write, until they complete:
// a peer that joins the operation late then finds its messages matched by these requests (not by the next
// operation's), and no buffer is freed under MPI.
// peers[i] is request i's peer, or -1 for a collective (which MPI cannot cancel).
void park_requests(std::vector<MPI_Request> requests, std::vector<int> peers,
                   std::vector<std::shared_ptr<const void>> buffers);
// Forgets parked requests that have completed.
void reap_parked_requests();

}  // namespace memtrain::dist::detail
