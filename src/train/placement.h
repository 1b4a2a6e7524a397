// Where a run's state lives and how its steps reduce (docs/training.md
// "Distributed training"). One process: whole tensors, LocalSync. Over a
// world communicator: the distributed layer (DistRuntime + DistLayer); each
// MoE layer's weights and their AdamW moments are this rank's shards
// (DistLayer::shard), norm scales are replicated, and the step's tokens are
// split by rows in global token order (rank r: [r*T/W, (r+1)*T/W)).
//
// Gradient reductions under a world: MoE shard gradients come back from the
// layer already reduced (the router's all-reduced), so only the norm scales
// are summed here (all_reduce_sum, rank order). The gradient norm counts every
// element once: a rank adds a tensor's squares only if it owns it, i.e. its
// coordinate is 0 on every mesh axis the tensor is replicated over (router
// and norm scales: rank 0 only; expert shards: data coordinate 0); the
// per-rank sums are then added in rank order.
//
// Thread safety: used by the training thread only.
#pragma once

#include <memory>

#include "moe/comm.h"
#include "moe/dist_layer.h"
#include "moe/dist_runtime.h"
#include "moe/trace.h"
#include "train/step.h"
#include "train/train_state.h"

namespace moe::train {

// GradientSync over a communicator: floats by all_reduce_sum; doubles by an
// all-gather summed in rank order (same bits on every rank).
class CommSync final : public GradientSync {
 public:
  explicit CommSync(Communicator& comm) : comm_(comm) {}
  void sum(float* data, int64_t n) override;
  void sum(double* data, int64_t n) override;
  int64_t bytes_moved() const override;  // every counted collective since the counters' reset

 private:
  Communicator& comm_;
};

class Placement {
 public:
  // comm null: one process. Else collective over *comm, which must outlive
  // this; throws moe::Error for a config the world cannot run.
  Placement(const Config& cfg, Communicator* comm);
  ~Placement();

  bool distributed() const { return comm_ != nullptr; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int size() const { return comm_ ? comm_->size() : 1; }
  // This rank's rows [begin, end) of a step's batch_tokens.
  std::pair<int64_t, int64_t> rows() const;
  const StepEnv& env() const { return env_; }
  StepTrace& trace() const { return *trace_; }
  // Null on one process.
  CommCounters* counters() const { return comm_ ? &comm_->counters() : nullptr; }

  // This rank's shards of a whole state every rank holds (a fresh run).
  TrainState shard(const TrainState& whole) const;
  // The same for a model (the teacher).
  Model shard(const Model& whole) const;
  // The same from a whole state on rank 0 only (a checkpoint only rank 0
  // read; other ranks pass any state of the config's shapes): broadcast, then cut.
  TrainState from_root(TrainState root) const;
  // Whole tensors on rank 0 (other ranks: an empty state). Collective.
  TrainState to_root(const TrainState& local) const;
  // True on every rank when `local` is true on every rank. Collective.
  bool all_ranks(bool local) const;

 private:
  void build_masks();
  TrainState map_moe(const TrainState& st, bool to_root) const;

  const Config& cfg_;
  Communicator* comm_;
  std::unique_ptr<DistRuntime> rt_;
  std::unique_ptr<DistLayer> layer_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<StepTrace> own_trace_;
  StepTrace* trace_ = nullptr;
  StepEnv env_;
};

}  // namespace moe::train
