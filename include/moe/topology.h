// The target a config is checked against (SPEC.md §1, "AOT compile for a
// topology"): ranks, cores per rank, MPI thread level, backend. A real run
// describes the machine it runs on; `moe validate --topology SPEC` describes
// one it does not run on, and both go through check_target.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config.h"
#include "moe/offload.h"

namespace moe {

struct Topology {
  int64_t ranks = 1;
  int64_t cores = 0;             // cores per rank; 0 = not given
  std::string mpi_thread;        // "" | single | funneled | serialized | multiple
  std::string backend;           // a builtin capability row, e.g. "mpi-multiple"
  std::string describe() const;  // "ranks=8, cores=4, mpi_thread=multiple, backend=mpi-multiple"
};

// Parses "ranks=8,cores=4,mpi_thread=multiple[,backend=NAME]" (any order,
// spaces ignored). The backend defaults to "mpi-<mpi_thread>", or to
// "single-process" when ranks=1 and no mpi_thread is given; an explicit
// backend wins. Throws moe::Error naming the bad item.
Topology parse_topology(const std::string& spec);

// This process, as a real single-process run sees it: one rank, the
// hardware's cores, backend single-process. (The MPI run derives its
// Topology from the communicator: size, provided thread level.)
Topology this_machine();
// The run's real target: the world's size and provided MPI thread level
// (backend "mpi-<level>"; a single-process world is "single-process").
class Communicator;
Topology topology_of(const Communicator& world);

// The mesh over `ranks` (check_parallel_config: the product of the three
// parallelism keys, E and D divisibility). One message per problem.
std::vector<std::string> mesh_problems(const Config& c, int64_t ranks);

// Everything a run checks against its target beyond config_problems(c).
struct TargetCheck {
  Topology topology;
  Capability capability;
  ResolvedOffload offload;            // valid when problems is empty
  std::vector<std::string> problems;  // errors: the run must not start
  std::vector<std::string> warnings;  // offload warnings, core budget
};

// The one check a real run and `moe validate --topology` share: backend
// known, mesh size, offload targets resolved with the backend's capability
// table (errors become problems). `training`: gradients will be computed.
TargetCheck check_target(const Config& c, const Topology& t, bool training);

}  // namespace moe
