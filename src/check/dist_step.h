// One distributed step of a `moe check` variant: the DistLayer over a mesh
// of the variant's ranks, then its results gathered whole on the root.
#pragma once

#include "check/problem.h"
#include "moe/comm.h"

namespace moe::check {

// Collective over `comm` (the variant's ranks; every member calls it, no
// other rank does). Rank r of W steps on tokens [r*T/W, (r+1)*T/W) of the
// problem. The counters are reset after sharding and read right after the
// backward, so `counts` holds the step's collectives only (not sharding, not
// the gathers to the root). Returns the whole tensors on comm rank 0; the
// other members get an empty result.
StepTensors distributed_step(const Config& cfg, bool explicit_plan, Communicator& comm, const Problem& p);

}  // namespace moe::check
