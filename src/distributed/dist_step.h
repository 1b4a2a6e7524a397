// Internal state of one distributed step (include/moe/dist_layer.h), shared
// by the forward (dist_forward.cpp) and backward (dist_backward.cpp)
// schedules.
#pragma once

#include <vector>

#include "distributed/ep_exchange.h"
#include "distributed/ring.h"
#include "distributed/step_exec.h"
#include "kernels/grouped_gemm.h"
#include "layer/expert_ffn.h"
#include "moe/dist_layer.h"
#include "route/aux_loss.h"
#include "route/router.h"
#include "route/routing.h"

namespace moe {

// One token chunk of this rank: its forward state and the events of its
// in-flight collectives.
struct Chunk {
  int64_t t0 = 0, t1 = 0;  // local token range
  std::vector<int64_t> prior;  // routed slots per expert before this chunk in the global order
  Routing routing;  // this rank's tokens of the chunk (kept slots: capacity in global order)
  Event routed;     // routing ready (index math: side engine under ragged_sort)
  // expert-parallel all-to-all path
  Lhs xs;  // [Rc, D] sorted by global expert (with no rows to move: x's rows through the permute's index)
  EpExchange ex;
  Tensor buf;  // receive buffer of the dispatch
  Event sent;  // dispatch all-to-all done (buf, ex ready)
  Lhs xl;      // [buffer_rows, D] received rows sorted by local expert (xs when none move)
  FfnActivations act;
  Tensor ys;   // [Rc, D] expert outputs back home, sorted order
  Event returned;
  // ring of experts
  RingState ring;
  Event gathered, reduced;
};

// Events of the expert weights' FSDP gathers (finished events when nothing moves).
struct WeightEvents {
  Event up, up_lo, up_hi, down;
};

struct DistForward {
  Tensor x;              // [T_l, D] dtype
  Tensor router_kernel;  // [D, E] f32
  RouterOutput router;
  AuxStats global;
  FfnWeights ffn;
  WeightEvents weights;
  std::vector<Chunk> chunks;
};

// Per-chunk backward temporaries and the events of their collectives.
struct ChunkGrad {
  Tensor buf, dx_rows, dW_rows;
  Event sent, returned;
  FfnGradInputs keep;
};

// Runs prepare / compute / finish over n chunks with `lookahead` chunks
// prepared ahead (0: strictly in order, the schedule without offload).
// before_drain() runs after the last compute and before the finishes still
// pending (with lookahead, the last chunks' returns are in flight then): work
// that needs no finish() result goes there to hide the pipeline's drain.
template <class Prepare, class Compute, class Finish, class BeforeDrain>
void run_pipeline(int64_t n, int64_t lookahead, Prepare prepare, Compute compute, Finish finish,
                  BeforeDrain before_drain) {
  for (int64_t c = 0; c < std::min(lookahead, n); ++c) prepare(c);
  for (int64_t c = 0; c < n; ++c) {
    if (lookahead == 0) prepare(c);
    else if (c + lookahead < n) prepare(c + lookahead);
    compute(c);
    if (c >= lookahead) finish(c - lookahead);
  }
  before_drain();
  for (int64_t c = std::max<int64_t>(n - lookahead, 0); c < n; ++c) finish(c);
}
template <class Prepare, class Compute, class Finish>
void run_pipeline(int64_t n, int64_t lookahead, Prepare prepare, Compute compute, Finish finish) {
  run_pipeline(n, lookahead, prepare, compute, finish, [] {});
}

// One AG over the world: every rank's aux statistics; returns the global sum
// (exact) and the routed counts of the ranks before this one.
AuxStats gather_stats(Communicator& world, const AuxStats& local, std::vector<int64_t>& prior);

}  // namespace moe
