// Ring of experts (SPEC.md §3, `use_ring_of_experts`): all-gather the
// chunk's tokens and their routing over the expert axis, run only this rank's
// experts on every gathered token, combine locally into a partial f32 output
// and reduce-scatter it back. Backward: all-gather dy, local adjoints,
// reduce-scatter dx and the combine-weight gradient.
//
// Exactness: a token's output is the sum of its K slot contributions; here
// the slots on one rank are summed first, then the ranks in rank order. For
// K <= 2 that equals the single-process slot-order sum bit for bit (f32
// addition is commutative); for K > 2 it is a regrouping of the same K terms
// (a few f32 ulps). The combine weights' gradient is exact (each slot is
// non-zero on one rank only).
#pragma once

#include "distributed/ep_exchange.h"
#include "layer/expert_ffn.h"
#include "route/routing.h"

namespace moe {

struct RingState {
  Tensor xg;                  // [EP*Tc, D] gathered tokens
  std::vector<int32_t> idx;   // [EP*Tc*K] gathered expert ids, rolled so this rank's experts come first
  std::vector<uint8_t> keep;  // [EP*Tc*K] kept slots (decided by each token's own rank)
  Tensor wg;                  // [EP*Tc, K] gathered combine weights
  Routing routing;            // over the gathered tokens
  Tensor xs;                  // [EP*Tc*K, D] gathered rows in that order
  EpExchange ex;              // local_groups and rows_from of the local experts (for the weight gradients)
  FfnActivations act;
  Tensor ysum;                // [Tc, D] f32: this rank's tokens' outputs after the reduce-scatter
};

// Tiled all-gather of rows over `comm` ([n, ...] -> [size*n, ...], one AG).
Tensor gather_rows_over(Communicator& comm, const Tensor& t);
// Deterministic reduce-scatter of f32 rows ([size*n, C] -> [n, C], one RS).
Tensor reduce_scatter_rows(Communicator& comm, const Tensor& t);

// Forward, in three phases (the collectives can run on the side engine):
// gather the chunk's tokens and routing (two AGs) ...
void ring_gather(Communicator& ep, int64_t num_experts, const Tensor& x_c, const int32_t* idx_c, const Tensor& w_c,
                 const std::vector<uint8_t>& keep, RingState& st);
// ... route, permute, run the local experts and combine into partial f32 outputs
// of every gathered token [EP*Tc, D] (then reduce_scatter_rows into st.ysum).
Tensor ring_compute(const Config& cfg, int ep_size, const FfnWeights& w, RingState& st);

// Backward on gathered dy [EP*Tc, D]: partial dx [EP*Tc, D] f32 and dW [EP*Tc, K] f32
// (then reduce_scatter_rows each); fills `keep` for the weight gradients.
struct RingGrads {
  Tensor dx, dW;
};
RingGrads ring_backward_compute(const Config& cfg, const FfnWeights& w, const RingState& st, const Tensor& dyg,
                                FfnGradInputs& keep);

}  // namespace moe
