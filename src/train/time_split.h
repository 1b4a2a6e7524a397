// The summary's time split of a step by kind of work, from its step trace
// (include/moe/trace.h): both the single-process layer and the distributed
// one name their ops alike, so the categories mean the same on both paths.
//
//   gemm             ffn, ffn_backward, weight_grads (the expert GEMMs)
//   permute_combine  sort, permute, combine and their backwards (routing index
//                    math and row movement)
//   router           router, router_backward (logits, top-k, aux losses)
//   exposed_comm     collectives and waits on the compute engine (AG:, A2A:,
//                    RS:, AR:, grad:, wait:): communication the step waited for
// Only compute-engine ops count (side-engine ops overlap them); a nested op's
// time is its own, not its parent's. "Other" = step time - the four.
#pragma once

#include <vector>

#include "moe/trace.h"

namespace moe::train {

struct TimeSplit {
  double gemm = 0, permute_combine = 0, router = 0, exposed_comm = 0;  // ms
  double sum() const { return gemm + permute_combine + router + exposed_comm; }
};

// Adds the exclusive time of every compute-engine op of one step to its category.
void add_time_split(const std::vector<TraceOp>& ops, TimeSplit& into);

}  // namespace moe::train
