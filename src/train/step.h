// One training step on this process's tokens, and the seam where a
// distributed run sums gradients and loss terms over ranks.
#pragma once

#include "moe/train.h"
#include "train/model.h"
#include "train/train_state.h"

namespace moe::train {

// Sums over the ranks that share a step. Thread safety: called from the
// training thread only. REQUIRES (distributed implementations): a
// deterministic order of additions, so every rank gets the same bits.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // In place: data[i] = sum over ranks of data[i].
  virtual void sum(float* data, int64_t n) = 0;
  virtual void sum(double* data, int64_t n) = 0;
  // Bytes this rank has sent so far (for the metrics).
  virtual int64_t bytes_moved() const = 0;
};

// One process: every sum is the identity.
class LocalSync final : public GradientSync {
 public:
  void sum(float*, int64_t) override {}
  void sum(double*, int64_t) override {}
  int64_t bytes_moved() const override { return 0; }
};

// How a step runs and reduces over ranks. The default (sync only) is one
// process: every gradient "summed" by LocalSync, every parameter counted in
// the gradient norm.
struct StepEnv {
  GradientSync* sync = nullptr;
  LayerExec student;  // the student's MoE layers
  LayerExec teacher;  // the teacher's (a frozen target generator)
  // Per parameter, in parameters() order (empty: all true):
  std::vector<char> summed;      // its gradient is summed over ranks by sync
  std::vector<char> norm_owner;  // this rank adds its gradient's squares to the global norm
};

// Inputs of step `step` (0-based), tokens [token_begin, token_end) of the
// step's batch_tokens: x ~ N(0, 1) [token_end - token_begin, D] f32, element
// (t, d) a pure function of (seed, step, t * D + d).
Tensor batch_inputs(const Config& cfg, int64_t step, int64_t token_begin, int64_t token_end);

// One update of `st` with this process's inputs x [T, D] (of global_tokens in
// the step): teacher targets, loss and gradients, sync, clip, AdamW, step+1.
// Fills every field of the returned metrics except the timing and throughput
// ones. Throws NonFiniteError naming the step (st unchanged) when the loss or
// the gradient norm is not finite.
StepMetrics train_step(const Config& cfg, TrainState& st, const Model& teacher, const Tensor& x,
                       int64_t global_tokens, GradientSync& sync, PhaseTimes& times);
// The same under `env`: st holds this rank's shards (distributed student).
// The loss, the metrics and the gradient norm are global (equal on every rank).
StepMetrics train_step(const Config& cfg, TrainState& st, const Model& teacher, const Tensor& x,
                       int64_t global_tokens, const StepEnv& env, PhaseTimes& times);

}  // namespace moe::train
