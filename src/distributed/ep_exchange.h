// Expert-parallel exchange of one token chunk (SPEC.md §3): the count
// all-gather, the ragged all-to-all that sends expert-sorted rows to the
// rank owning the expert, the local sort by local expert, and the reverse
// all-to-all that brings results home. With one expert rank it is the
// identity and moves nothing.
#pragma once

#include "comm/ep_plan.h"
#include "comm/hier_a2a.h"
#include "kernels/grouped_gemm.h"
#include "moe/comm.h"
#include "moe/config.h"
#include "moe/mesh.h"
#include "moe/tensor.h"

namespace moe {

// Where a mesh's expert-parallel all-to-alls run: flat on the expert
// communicator, or in two phases (hier non-null: docs/distributed.md,
// "Hierarchical all-to-all"). Both give the same receive buffer, byte for byte.
struct EpComm {
  Communicator& comm;
  const HierAllToAll* hier = nullptr;
};
// REQUIRES: hierarchical implies m.expert_hier()->usable().
EpComm ep_comm(const Mesh& m, bool hierarchical);

// Whether the layer's ragged all-to-alls run hierarchically on `mesh`
// (config key ep_all_to_all): flat never; auto when the expert group spans
// several hosts with the same number (> 1) of ranks each; hierarchical then
// too, is the flat exchange on one host or with one rank per host, and is an
// error (naming the key and the hosts) when the hosts have unequal numbers
// of ranks. The same answer on every rank.
bool use_hierarchical_a2a(const Config& cfg, const Mesh& mesh);

struct EpExchange {
  int ep = 1, rank = 0;
  int64_t experts_per_rank = 0;  // E_l
  int64_t sent_rows = 0;         // rows of this rank's sorted buffer that are routed (kept)
  int64_t buffer_rows = 0;       // receive buffer rows
  int64_t dropped = 0;           // rows this rank sent that the receivers' capped buffers dropped
  CountMatrix gg;                // [EP, E] kept group sizes of every sender
  CountMatrix counts, capped;    // [EP, EP] rows sender i sends to j, before / after the buffer cap
  A2ALayout dispatch, combine;   // in rows
  LocalPermute local;            // received buffer -> sorted by (local expert, sender)
  GroupLayout local_groups;      // [E_l] rows per local expert
  // rows_from[i * E_l + g]: rows of sender i for local expert g (after the cap), in sorted order.
  std::vector<int64_t> rows_from;
  bool identity() const { return ep == 1; }
};

// Collective over `ep_comm` (one AG of the [E] group sizes). groups: this
// rank's kept rows per global expert; routed_rows = T_l*K (caps the buffer
// at int(routed_rows * buffer_factor) rows when buffer_factor > 0).
EpExchange plan_exchange(Communicator& ep_comm, const GroupLayout& groups, int64_t num_experts, int64_t routed_rows,
                         double buffer_factor);

// The exchange in four steps, so the all-to-alls (side engine when offloaded)
// and the row movement (compute pool) can run on different threads:
// xs [R_l, D] sorted by global expert -> receive buffer [buffer_rows, D] (one A2A).
Tensor ep_send(const EpComm& ep, const EpExchange& ex, const Tensor& xs);
// Receive buffer -> xl [buffer_rows, D] sorted by local expert (row gather).
Tensor ep_sort_local(const EpExchange& ex, const Tensor& buf);
// yl sorted by local expert -> buffer order (row scatter).
Tensor ep_unsort_local(const EpExchange& ex, const Tensor& yl);
// Buffer -> [R_l, D] in this rank's sorted order (one A2A); rows a capped
// buffer dropped come back as zeros.
Tensor ep_send_back(const EpComm& ep, const EpExchange& ex, const Tensor& buf, int64_t routed_rows);

// Both halves of each direction (identity with one expert rank).
Tensor ep_dispatch(const EpComm& ep, const EpExchange& ex, const Tensor& xs);
Tensor ep_return(const EpComm& ep, const EpExchange& ex, const Tensor& yl, int64_t routed_rows);

}  // namespace moe
