// The MoE layer across MPI ranks (SPEC.md §3): the same function as one
// process over all of the step's tokens, in global token order (rank r holds
// tokens [r*T/W, (r+1)*T/W)).
//
// One step on a rank: route the local tokens; all-gather the aux statistics
// (fixed point, so the losses equal the single-process ones exactly); gather
// the expert weights to the needed layout; then per token chunk: sort ->
// permute -> expert-parallel dispatch (ragged all-to-all) -> local FFN ->
// return all-to-all -> combine (ring of experts instead: all-gather the
// chunk's tokens -> local experts only -> reduce-scatter the partial outputs). The backward runs the chunks' adjoints, then
// the weight gradients once over all chunks' rows in single-process order,
// then reduces them to the stored shards.
//
// Bit-exactness: y, grad.x, the routing and the aux losses equal the single
// process bit for bit (every kernel is row-independent). Expert weight
// gradients are bit-exact when each expert's rows live on one rank
// (data = fsdp = 1); otherwise they are sums of per-rank partials in rank
// order: within a few f32 ulps of the single-process sum per element.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "moe/config.h"
#include "moe/dist_runtime.h"
#include "moe/layer.h"
#include "moe/mesh.h"

namespace moe {

struct DistForward;
struct ChunkGrad;
class StepExec;
struct DistForwardDeleter {
  void operator()(DistForward* p) const;
};
using DistForwardPtr = std::unique_ptr<DistForward, DistForwardDeleter>;

class DistLayer {
 public:
  // REQUIRES: mesh.shape() matches the config's parallelism.
  // explicit_fsdp_plan: weight gradients go back by the gather plan's
  // reduce-scatter instead of the boundary all-reduce (bit-identical).
  // trace (optional): every op of each step is recorded there.
  DistLayer(const Config& cfg, const Mesh& mesh, bool explicit_fsdp_plan = false, StepTrace* trace = nullptr);
  // With a runtime: its mesh, its offload plan (fsdp_all_gather live selects
  // the explicit plan; live targets run their ops on the side engine) and
  // its step trace. The runtime must outlive the layer.
  DistLayer(const Config& cfg, const DistRuntime& rt);

  // This rank's shards of full weights (as stored: SPEC.md §3).
  LayerWeights shard(const LayerWeights& full) const;
  // Collective: full weights (or gradients) on world rank 0 from every rank's shards.
  LayerWeights unshard_to_root(const LayerWeights& shards) const;

  // x: [T_l, D] this rank's tokens; forced: optional [T_l, K]. `out` holds the
  // local rows (y, topk), the global aux losses, and this rank's counts:
  // group_sizes (rows of this rank's tokens kept per expert) and dropped
  // (this rank's slots dropped by capacity or a capped buffer); sum them over
  // the ranks for the global numbers.
  DistForwardPtr forward(const LayerWeights& shards, const Tensor& x, const Tensor* forced, LayerOutputs& out) const;
  // dy: [T_l, D]. Returns dx [T_l, D] and the gradients of this rank's shards. aux: the aux
  // losses' cotangents (layer_backward); the same on every rank (the losses are global).
  LayerGrads backward(const DistForward& fwd, const Tensor& dy, const AuxCotangents& aux = {}) const;

 private:
  void forward_a2a(const StepExec& ex, DistForward& f, Tensor& y) const;
  void forward_ring(const StepExec& ex, DistForward& f, Tensor& y) const;
  // before_drain: run after the last chunk's FFN backward, before the pending returns are waited for.
  void backward_a2a(const StepExec& ex, const DistForward& f, const Tensor& dy, Tensor& dx, Tensor& dW,
                    std::vector<ChunkGrad>& cg, const std::function<void()>& before_drain) const;
  void backward_ring(const StepExec& ex, const DistForward& f, const Tensor& dy, Tensor& dx, Tensor& dW,
                     std::vector<ChunkGrad>& cg, const std::function<void()>& before_drain) const;

  const Config& cfg_;
  const Mesh& mesh_;
  bool explicit_plan_;
  const DistRuntime* rt_;
  StepTrace* trace_;
  bool hier_a2a_ = false;  // ep_all_to_all resolved on this mesh (ep_exchange.h)
};

// Checks the config against a world of `world_size` ranks before any
// communication: the mesh product, E divisible by expert_parallelism, a
// multi-rank config without a launcher. Returns the resolved mesh shape.
MeshShape check_parallel_config(const Config& cfg, int world_size);

}  // namespace moe
