// `moe train`: the main job. A stack of num_layers pre-norm residual MoE
// blocks (h <- h + MoE(RMSNorm(h))) is trained with AdamW on a
// teacher-student task: a frozen teacher of the same architecture
// (teacher_seed) maps random inputs x ~ N(0, 1) [batch_tokens, D] to targets;
// the student (seed) learns them. loss = MSE + the layers' aux losses.
// docs/training.md describes the model, optimizer, schedule, checkpoints,
// metrics and resume semantics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moe/comm.h"
#include "moe/config.h"
#include "moe/error.h"

namespace moe {

// What one step measured (also one line of the metrics file).
struct StepMetrics {
  int64_t step = 0;  // 1-based: updates completed including this one
  int64_t total_steps = 0;
  double loss = 0, mse = 0;
  double lb = 0, z = 0;          // aux losses summed over layers (already weighted)
  double lr = 0, grad_norm = 0;  // grad_norm: before clipping
  double step_ms = 0, tokens_per_s = 0;
  int64_t tokens = 0, dropped = 0;
  // Bytes of every counted collective of the step on this rank (0 on one
  // process); SO: ops the side engine ran in the step (0 without offload).
  int64_t collective_bytes = 0, side_ops = 0;
  std::vector<double> load_max, load_mean;  // per layer: tokens of the busiest expert, mean per expert
};

// What a run did, for the closing summary.
struct TrainSummary {
  int64_t first_step = 0, last_step = 0;  // steps run by this invocation
  double first_loss = 0, last_loss = 0;
  double seconds = 0;  // wall time of the steps
  double tokens_per_s = 0;
  double gflops = 0;  // model FLOPs / s (see docs/training.md)
  // Time split in ms: data, teacher forward, RMSNorm (fwd+bwd), MoE layer forward, MoE layer backward,
  // optimizer (clip + AdamW), other. The MoE layer is timed as a whole.
  double ms_data = 0, ms_teacher = 0, ms_norm = 0, ms_moe_forward = 0, ms_moe_backward = 0, ms_optimizer = 0,
         ms_other = 0;
  // The same steps by kind of work, from the step trace (src/train/time_split.h):
  // expert GEMMs, permute/combine (with routing index math), router, exposed
  // communication, and the rest of the step (norms, loss, optimizer, data).
  double ms_gemm = 0, ms_permute_combine = 0, ms_router = 0, ms_exposed_comm = 0, ms_rest = 0;
  double load_balance = 0;  // max/mean tokens per expert, averaged over steps and layers
  int ranks = 1;
  // One rank's dense GEMM [R_l, D] x [D, 3F] (R_l = rows per rank), measured
  // after the steps; fraction_of_dense = (gflops / ranks) / dense_gflops, < 0:
  // not measured ("n/a").
  double dense_gflops = 0, fraction_of_dense = -1;
  // Which matmul that was and why ("oneDNN f32 matmul (bf16 layer at ...)"; src/bench/dense_baseline.h).
  std::string dense_baseline;
  std::string last_checkpoint;  // "" when none was written
  // Memory of a step on this rank (docs/training.md): the largest live tensor bytes during any step
  // (tensor_memory_stats) and the analytic minimum (train_step_minimum), term by term.
  double step_peak_mib = 0, step_minimum_mib = 0;
  std::string step_minimum_terms;
};

// A run stopped because the loss or the gradients became non-finite. The
// message names the step and the last good checkpoint.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

struct TrainOptions {
  std::string resume_dir;  // "" = fresh run; else continue from its `latest` checkpoint
  int64_t stop_at = -1;    // stop after this step (checkpointing it); -1: run to cfg.steps
  std::function<void(const StepMetrics&)> on_step;  // progress display
  std::function<void(const std::string&)> log;      // informational lines (resume, checkpoints)
  // Null: one process. Else the world to train over with the distributed
  // layer (docs/training.md "Distributed training"); the callbacks and the
  // metrics file then run on rank 0 only, and rank 0 reads and writes the
  // checkpoints (whole tensors).
  Communicator* comm = nullptr;
  bool measure_dense = true;  // measure the dense GEMM baseline after the steps
};

// Runs (or resumes) training. Throws moe::Error for bad input (config,
// checkpoint) and NonFiniteError when the loss diverges.
TrainSummary run_training(const Config& cfg, const TrainOptions& opt);

// The embedded default config of `moe train` (YAML text).
const char* default_train_config();

// FLOPs of one training step (student forward+backward = 3x forward, plus the
// teacher's forward), forward per layer = 6*R*D*F + 2*T*D*E with T = batch_tokens.
double train_step_flops(const Config& cfg);

}  // namespace moe
