// α–β costs of the step's collectives (docs/distributed.md, "Model of
// scale"). A message of n bytes over a link costs α + n/β. A group of P ranks
// spans h hosts with p_local = P/h of its members on each; `sharing` groups
// run the same collective at once on every host, so a host's NIC bandwidth is
// split between them (β_inter per group = inter.bw / sharing). Bytes are per
// rank. Each formula is written out in the .cpp beside its code. Every
// collective of P > 1 ranks adds the link's sync_s once (the wait for the
// slowest member on time-sliced cores; 0 unless measured or given).
#pragma once

#include <string>

#include "plan/cluster.h"

namespace moe::plan {

struct Group {
  int size = 1;     // P
  int p_local = 1;  // members per host (P when the group is inside one host)
  int sharing = 1;  // groups using one host's NIC at once (>= 1)
  int hosts() const { return size / p_local; }
};

// The group of ranks at stride `stride` (rank-major mesh: expert 1, fsdp EP,
// data EP*fsdp), `size` members, on a cluster of `ranks_per_host` consecutive
// ranks per host.
Group make_group(int size, int stride, int ranks_per_host);

// Cost in seconds, with the split into latency and bandwidth terms.
struct Cost {
  double alpha_s = 0, beta_s = 0;
  double total() const { return alpha_s + beta_s; }
};

enum class A2AAlgo { flat, hierarchical };
const char* a2a_algo_name(A2AAlgo a);

// All-to-all: each rank holds n bytes, n/P for every member (itself included).
Cost all_to_all(A2AAlgo algo, const Group& g, double n, const Link& intra, const Link& inter);
// Ring all-gather: each rank contributes n bytes, ends with P*n.
Cost ring_all_gather(const Group& g, double n, const Link& intra, const Link& inter);
// Recursive-doubling all-gather (MPI's choice for small blocks): ceil(log2 P) steps.
Cost rd_all_gather(const Group& g, double n, const Link& intra, const Link& inter);
// MPI_Allgather: the cheaper of the two (the library picks by size).
Cost all_gather(const Group& g, double n, const Link& intra, const Link& inter);
// Reduce-scatter of P*n bytes in, n out per rank (ring, or the engine's
// all-to-all of blocks: the same bytes and P-1 messages).
Cost ring_reduce_scatter(const Group& g, double n, const Link& intra, const Link& inter);

}  // namespace moe::plan
