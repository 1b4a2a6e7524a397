// Shared state of the multi-rank tests (run under mpirun): the world
// communicator made once by main(), and seeded payload helpers.
#pragma once

#include <cstdint>

#include "moe/comm.h"

namespace moe::testing {

Communicator& world();

// A float that depends only on (rank, index, salt): the same on every rank
// that computes it, varied in magnitude so sums are order-sensitive.
float seeded_float(int rank, int64_t index, uint32_t salt);

}  // namespace moe::testing
