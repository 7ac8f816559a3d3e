// The MPI backend as communicator.cpp sees it: no MPI types, so the common code compiles without mpi.h. Defined
// in mpi_communicator.cpp and mpi_runtime.cpp, which are built only when MPI was found (MEMTRAIN_HAVE_MPI).
#pragma once

#include "memtrain/dist/communicator.h"

#include <memory>

namespace memtrain::dist::detail {

// MPI_COMM_WORLD as a Communicator; initialises MPI on the first call.
std::shared_ptr<Communicator> make_mpi_world();
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised and not finalised; returns otherwise.
void abort_mpi_if_running(int code);

}  // namespace memtrain::dist::detail
