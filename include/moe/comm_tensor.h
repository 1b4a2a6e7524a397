// Whole tensors between rank 0 (which reads and writes files) and the other
// ranks: `moe step` under mpirun scatters the inputs' rows from the root and
// gathers the outputs' rows back to it (SPEC.md §7). These are file I/O
// traffic and are not counted as collectives.
//
// Row split: of N rows, rank r of W holds rows [r*N/W, (r+1)*N/W) (floor
// division), the token order of SPEC.md §3.
#pragma once

#include <cstdint>

#include "moe/comm.h"
#include "moe/tensor.h"

namespace moe {

// Rows [begin, end) of N held by rank r of W.
inline int64_t row_begin(int64_t n, int r, int w) { return n * r / w; }

// Every rank gets a copy of root's tensor (dtype and shape travel too);
// `t` is only read on root.
Tensor broadcast_tensor(Communicator& comm, const Tensor& t, int root);
// Rank r gets its rows (dim 0) of root's tensor; `full` is only read on root.
Tensor scatter_rows(Communicator& comm, const Tensor& full, int root);
// Root gets the ranks' tensors concatenated along dim 0 in rank order (other
// dims and dtype must agree: an error naming the rank otherwise); the other
// ranks get an empty (undefined) tensor.
Tensor gather_rows(Communicator& comm, const Tensor& local, int root);

}  // namespace moe
