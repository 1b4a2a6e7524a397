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

#include "dist/ep_exchange.h"
#include "layer/expert_ffn.h"
#include "route/routing.h"

namespace moe {

struct RingState {
  Routing routing;  // over the gathered tokens, expert ids rolled so this rank's experts come first
  Tensor xs;        // [EP*Tc*K, D] gathered rows in that order
  Tensor wg;        // [EP*Tc, K] gathered combine weights
  EpExchange ex;    // local_groups and rows_from of the local experts (for the weight gradients)
  FfnActivations act;
};

// x_c [Tc, D] dtype, idx_c / w_c [Tc, K], keep: this rank's kept slots. Writes y_c [Tc, D] (dtype).
RingState ring_forward(const Config& cfg, Communicator& ep, const FfnWeights& w, const Tensor& x_c,
                       const int32_t* idx_c, const Tensor& w_c, const std::vector<uint8_t>& keep, Tensor& y_c);

// dy_c [Tc, D]: writes dx_c [Tc, D] f32 (the MoE part) and dW_c [Tc, K] f32; fills `keep`.
void ring_backward(const Config& cfg, Communicator& ep, const FfnWeights& w, const RingState& st,
                   const Tensor& dy_c, Tensor& dx_c, Tensor& dW_c, FfnGradInputs& keep);

}  // namespace moe
