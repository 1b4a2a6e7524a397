// Resources before work (docs/reliability.md): the memory one rank needs for
// a config, from the shapes the code allocates, checked against this
// machine's memory before any of it is allocated. Sums in long double: no
// overflow whatever the keys (a 2^64-byte estimate is just a large number).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config.h"

namespace moe {

struct MemoryEstimate {
  int64_t tokens = 0;           // tokens of one step on this rank
  int64_t ffn_rows = 0;         // rows the expert FFN of one layer runs on (the receive buffer's)
  long double weights = 0;      // the layer's weights one rank holds (stored dtype; f32 router)
  long double train_state = 0;  // moe train: teacher, parameters, gradients, AdamW m and v (f32), every layer
  long double activations = 0;  // one step: the forward's saved tensors (every layer) and one backward's work
  long double buffers = 0;  // the distributed layer: permute, all-to-all / all-gather buffers (every layer)
  long double total() const { return weights + train_state + activations + buffers; }
  std::string describe() const;  // "weights X, training state Y, activations Z, buffers W (GiB)"
};

// The analytic minimum of one layer's forward + backward on one process, term by term
// (docs/architecture.md, "Memory of one step"): what a step cannot do without, each tensor
// counted once. `moe bench`, `moe train` and the Python layer print their measured peak next to it.
struct StepMinimum {
  long double weights = 0;  // stored weights: experts in weight_dtype, the router in router_dtype
  long double weight_copies =
      0;  // the experts' compute-dtype copies (0 when stored in it), the router's f32 copy
  long double gradients = 0;  // the f32 gradient of every weight
  long double saved = 0;  // what the backward reads from the forward (router input and outputs, xs, h, a, ys)
  long double step_io = 0;    // the step's own inputs and outputs: x, y, dy and dx
  long double comm = 0;       // communication buffers (0 on one process)
  long double optimizer = 0;  // moe train: AdamW m and v and the teacher's parameters (f32)
  long double total() const {
    return weights + weight_copies + gradients + saved + step_io + comm + optimizer;
  }
  // "weights 1.5 MiB + copies 0 + gradients 3 MiB + saved 2 MiB + io 1 MiB + comm 0 = 7.5 MiB"
  std::string describe() const;
};

// tokens: T of the step; x_dtype / dy_dtype: the dtypes the caller passes x and dy in; router_dtype:
// the stored router's dtype. Routed rows: T * K (dropless; capacity drops only lower them).
// One layer_forward + layer_backward on one process at the active kernel level: the permuted rows
// xs count as saved unless the level's GEMMs gather them (layer_permutes_in_gemm: the index instead).
StepMinimum step_minimum(const Config& c, int64_t tokens, DType x_dtype, DType router_dtype = DType::f32);

// moe train's step on one rank (num_layers blocks, tokens of this rank): f32 parameters (router,
// local experts, norm scale), their gradients, AdamW m and v and the teacher, every layer's
// compute-dtype expert copies and saved tensors (plus the norm's and the stack's own), and the
// distributed layer's buffers (estimate_memory's).
StepMinimum train_step_minimum(const Config& c, int64_t tokens, int64_t ranks);

// One rank's memory for a step of `tokens` tokens on this rank. ranks: the
// world's size (for the parallelism keys that are -1; ranks <= 0: unknown, an
// axis of -1 counts as 1). train_stack: moe train's model (num_layers blocks,
// teacher and optimizer state); else one layer's forward and backward.
MemoryEstimate estimate_memory(const Config& c, int64_t tokens, int64_t ranks, bool train_stack);

// The tokens of one step on one rank: batch_tokens over the ranks (ceil).
int64_t tokens_per_rank(const Config& c, int64_t ranks);

// This machine's physical memory in bytes (0 when unknown).
uint64_t physical_memory_bytes();

// A problem when estimate_memory(c, tokens_per_rank(c, ranks), ranks,
// train_stack) is above `memory` bytes (0: no check), naming the bytes, the
// parts and the keys that drive them.
std::vector<std::string> memory_problems(const Config& c, int64_t ranks, bool train_stack, uint64_t memory);

}  // namespace moe
