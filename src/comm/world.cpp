// Choosing the world communicator: MPI when a launcher started us and MPI is
// compiled in, the single-process communicator otherwise.
#include <cstdlib>
#include <string>

#include "moe/comm.h"
#include "moe/error.h"
#include "moe/watchdog.h"
#ifdef MOE_HAVE_MPI
#include "comm/mpi_comm.h"
#endif

namespace moe {
#ifndef MOE_HAVE_MPI
namespace {
const char* launcher_size_env() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v)) return s;
  return nullptr;
}
}  // namespace
#endif

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

bool mpi_compiled_in() {
#ifdef MOE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int ranks_per_host_override() {
  const char* v = std::getenv("MOE_RANKS_PER_HOST");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 1 || n > (1 << 24))
    fail("MOE_RANKS_PER_HOST='", v, "': expected a positive integer (world ranks per host: ranks [0, n) are host 0, ",
         "[n, 2n) host 1, ...); unset it to let MPI tell the hosts");
  return int(n);
}

std::unique_ptr<Communicator> make_world_comm() {
  collective_timeout();  // a bad MOE_COLLECTIVE_TIMEOUT_S or _LIVENESS_S is an error here, before MPI
  if (!launched_by_mpi()) return make_single_process_comm();
#ifdef MOE_HAVE_MPI
  return make_mpi_world_comm();
#else
  const char* size = launcher_size_env();
  if (size && std::string(size) != "1")
    fail("started by mpirun with ", size, " ranks, but this build of moe has no MPI support; rebuild with "
         "MPI (libopenmpi-dev) or run a single process");
  return make_single_process_comm();
#endif
}

}  // namespace moe
