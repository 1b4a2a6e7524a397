// `moe plan --calibrate`: measures the kernel rates of rates.h on this
// machine. Per layer shape and token count it steps a one-rank distributed
// layer (the same ops as every rank of a distributed step) with the step
// trace on, at one pool thread, and divides each op's useful work by its
// median time; then the pool's speedup at its full size, memcpy, the side
// engine's hand-off, and (under mpirun with >= 2 ranks) the shared-memory
// link's α and β with an all-to-all probe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moe/comm.h"
#include "plan/rates.h"
#include "plan/step_model.h"

namespace moe::plan {

struct CalibrateOptions {
  std::vector<LayerShape> shapes;  // T of each: the largest token count; also T/4 and T/16
  int iters = 3;
  int pool_threads = 0;  // 0: the compute pool's size when called
  std::function<void(const std::string&)> log;
};

// One process: the kernels, memcpy, the side engine's hand-off; the link is derived from memcpy
// (intra_measured false). Under mpirun (world of >= 2 ranks, collective): only the link's α and β,
// the rest of the result left empty (rank 0's numbers are returned).
Rates calibrate(const CalibrateOptions& o, Communicator& world);

}  // namespace moe::plan
