// Hierarchical ragged all-to-all (docs/distributed.md, "Hierarchical
// all-to-all"): the scheme of Tutel's 2DH and DeepSpeed-MoE's hierarchical
// all-to-all on a communicator whose ranks sit on several hosts.
//
// Ranks are numbered (host h, local index l). Phase 1, within each host (one
// A2A on the host's communicator): rank (h, l) sends local rank l' every row
// it has for ranks (h'', l'), all hosts h''. Phase 2, one lane per local
// index l (one A2A on the lane's communicator, one rank per host): rank
// (h, l') sends rank (h'', l') the rows of all L ranks of host h for it, as
// ONE message. So the rows a host pair exchanges travel in L messages each
// way instead of L*L, each L times larger; every row still crosses the host
// boundary once. Phase 2 writes each row at the offset the flat all_to_allv
// would: the receive buffer is byte-identical (positions the layout does not
// name are left untouched, as by MPI_Alltoallv).
//
// Counting: each phase is one all_to_allv on a sub-communicator made by
// split(), so a hierarchical all-to-all adds 2 to the parent's A2A count and
// the bytes both phases send.
//
// Thread safety: as Communicator (one thread at a time per object).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/ep_plan.h"
#include "moe/comm.h"

namespace moe {

// Where the ranks of a communicator live. Hosts are numbered by their lowest
// rank; a host's ranks (its local indices) by rank.
struct HostMap {
  std::vector<int> host, local;           // per rank of the communicator
  std::vector<std::vector<int>> members;  // [host][local index] -> rank
  int hosts() const { return int(members.size()); }
  // The ranks per host when every host has the same number, else 0.
  int ranks_per_host() const;
  // "2 hosts x 2 ranks" or "2 hosts with 3, 1 ranks".
  std::string describe() const;
};

class HierAllToAll {
 public:
  // Collective over `comm` (which must outlive this object): detects the
  // hosts (Communicator::split_by_host) and, when there are several hosts
  // with the same number (> 1) of ranks each, makes the lane communicators.
  // Setup traffic only (split, broadcast, gatherv: not counted).
  explicit HierAllToAll(Communicator& comm);
  ~HierAllToAll();

  const HostMap& hosts() const { return map_; }
  // Several hosts, the same number of ranks on each, more than one: the
  // two phases differ from the flat all-to-all. Every rank agrees.
  bool usable() const { return lane_ != nullptr; }

  // The flat comm.all_to_allv(send, recv, mine, elem_bytes), in two phases.
  // counts [P, P]: elements rank i sends rank j, the same on every rank
  // (mine.send_counts must be its row, mine.recv_counts its column).
  // REQUIRES: usable().
  void all_to_allv(const void* send, void* recv, const A2ALayout& mine, const CountMatrix& counts,
                   size_t elem_bytes) const;

 private:
  Communicator& comm_;
  HostMap map_;
  std::unique_ptr<Communicator> intra_, lane_;
};

}  // namespace moe
