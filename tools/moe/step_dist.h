// The two paths of `moe step`: single process and distributed, sharing the
// output writer (one file contract, SPEC.md §7).
#pragma once

#include <string>

#include "moe/config.h"
#include "moe/layer.h"

namespace moe::cli {

struct StepPaths {
  std::string weights, inputs, out;
  std::string trace;  // optional: Chrome trace JSON of the step, every rank's ops (written by rank 0)
};

struct StepResult {
  LayerOutputs outputs;
  LayerGrads grads;
};

// Writes the contracted output file (grads only when `backward`), and prints a summary.
void write_step_outputs(const Config& cfg, const StepResult& r, bool backward, const std::string& path);

// The distributed layer through a DistRuntime (offload targets live, side
// engine), on any number of ranks (one rank equals the single-process layer
// bit for bit). With paths.trace: the step trace of every rank gathered on
// rank 0 and written as Chrome trace JSON (one track per engine per rank).
// Call inside run_collectively (an error on one rank must end the job).
void run_step_distributed(const Config& cfg, const StepPaths& paths);

}  // namespace moe::cli
