// Every rank's step-trace ops on one rank (moe step --trace, moe bench --dist
// --trace-dir), for chrome_trace_json (include/moe/trace.h).
#pragma once

#include <vector>

#include "moe/comm.h"
#include "moe/trace.h"

namespace moe {

// Collective over `comm` (two uncounted gathervs: sizes, then the records of
// serialize_ops). Returns the ops of every rank, rank by rank, on `root`;
// empty elsewhere.
std::vector<TraceOp> gather_trace_ops(Communicator& comm, const std::vector<TraceOp>& mine, int root = 0);

}  // namespace moe
