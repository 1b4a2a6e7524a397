// The MPI communicator (built only with MOE_HAVE_MPI). See moe/comm.h for the
// contract; this header only exposes the factory used by make_world_comm().
#pragma once

#include <memory>

#include "moe/comm.h"

namespace moe {

// Initializes MPI (MPI_Init_thread requesting MPI_THREAD_MULTIPLE; the level
// provided is kept in thread_level()), installs the aborting error handler on
// MPI_COMM_WORLD and returns a duplicate of it. With MPI_THREAD_MULTIPLE (and
// when this code initialized MPI) it also starts the collective watchdog's
// liveness responder on a probe communicator of its own (include/moe/watchdog.h).
// MPI is finalized when the last communicator made from it is destroyed.
std::unique_ptr<Communicator> make_mpi_world_comm();

}  // namespace moe
