// Which ranks of a communicator share a host and which share a machine's cores, for the wait
// policy of Communicator::set_polite_waits_from (docs/distributed.md, "Waiting on shared cores").
// A host is what Communicator::split_by_host tells apart (MPI's shared-memory node, or
// MOE_RANKS_PER_HOST): between hosts MPI sends over the network. A machine is a running kernel
// (its boot id): the network namespaces of scripts/cluster.sh are hosts of one machine, and their
// kernel's TCP work runs on the cores that machine's ranks wait on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "moe/comm.h"

namespace moe {

// Blocking collectives sending this many bytes or more wait politely in a group that spans hosts,
// when a machine runs more ranks than it has cores.
inline constexpr size_t kSharedCorePoliteBytes = size_t(2) << 20;

// This machine's boot id (the same in every network namespace of it, different on another
// machine), "" where it cannot be read.
std::string boot_id();
// This machine: a hash of boot_id(), else of the host name.
uint64_t machine_id();

// Collective over `comm` (uncounted: a gatherv to rank 0, a broadcast, a host split): the threshold for
// set_polite_waits_from on its groups that span hosts. kSharedCorePoliteBytes when its ranks sit on
// more than one host and some machine has more of them than cores, else 0.
// MOE_POLITE_FROM_BYTES=N (rank 0's) overrides: N bytes whenever the ranks span hosts, 0 never.
// The single-process communicator: 0, without communicating.
size_t shared_core_polite_bytes(Communicator& comm);

// Collective over `comm` (uncounted: a host split): whether its ranks sit on more than one host.
bool spans_hosts(Communicator& comm);

}  // namespace moe
