// The two paths of `moe step`: single process and distributed, sharing the
// output writer (one file contract, SPEC.md §7).
#pragma once

#include <string>

#include "moe/config.h"
#include "moe/layer.h"

namespace moe::cli {

struct StepPaths {
  std::string weights, inputs, out;
};

struct StepResult {
  LayerOutputs outputs;
  LayerGrads grads;
};

// Writes the contracted output file (grads only when `backward`), and prints a summary.
void write_step_outputs(const Config& cfg, const StepResult& r, bool backward, const std::string& path);

// True when the fsdp_all_gather offload target is live for this run (the
// explicit gather plan replaces the boundary gather).
bool fsdp_plan_live(const Config& cfg);

void run_step_distributed(const Config& cfg, const StepPaths& paths);

}  // namespace moe::cli
