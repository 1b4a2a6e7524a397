// Expert weights over the mesh (SPEC.md §3): how each weight is stored
// (sharded), the layout the layer needs on a rank, the FSDP gather between
// them and the gradient's way back.
//
// Stored specs: router.kernel replicated; experts E over `expert` and D over
// `fsdp` (wi: dim 1, wo: dim 2), or E over (expert, fsdp) with
// shard_exp_on_fsdp; the split layout [2, E, D/2, 2F] shards dim 1 (E) over
// `fsdp` (and wo's E over `fsdp`; expert_parallelism is 1 there). Needed: E over `expert` only (this rank's E_l experts, full D).
// Axes of extent 1 are dropped from specs, so a trivial axis costs nothing.
#pragma once

#include <string>

#include "comm/gather_plan.h"
#include "moe/config.h"
#include "moe/layer.h"
#include "moe/mesh.h"

namespace moe {

ShardSpec stored_spec(const Config& cfg, const Mesh& mesh, const std::string& weight);
ShardSpec needed_spec(const Config& cfg, const Mesh& mesh, const std::string& weight);

// This rank's stored shards of full weights.
LayerWeights shard_weights(const Config& cfg, const Mesh& mesh, const LayerWeights& full);

// Collective over the world: full weights (stored-spec shards reassembled)
// on world rank 0; other ranks get undefined tensors.
LayerWeights unshard_to_root(const Config& cfg, const Mesh& mesh, const LayerWeights& shards);

// How the FSDP gather runs: the boundary gather (gradients all-reduced, then
// each rank keeps its shard) or the explicit plan (gradients reduce-scattered
// straight to the shard). Same gathers forward; bit-identical gradients.
enum class GatherMode { boundary, explicit_plan };

// Weights in the needed layout, cast to cfg.dtype before they move (router stays f32).
LayerWeights gather_weights(const Config& cfg, const Mesh& mesh, const LayerWeights& shards);

// One expert weight's shard (already cast) gathered to the needed layout
// (no collective when the plan is empty: needs_gather is false).
Tensor gather_weight(const Config& cfg, const Mesh& mesh, const std::string& name, const Tensor& local);
bool needs_gather(const Config& cfg, const Mesh& mesh, const std::string& name, int ndim);
// Split layout: expert half h of the (cast) wi shard, gathered alone -> [E/2, D, 2F].
Tensor gather_wi_half(const Config& cfg, const Mesh& mesh, const Tensor& wi, int h);

// One weight's gradient (needed layout, f32) -> its stored shard's gradient.
Tensor reduce_gradient(const Config& cfg, const Mesh& mesh, const std::string& name, const Tensor& grad,
                       GatherMode mode);
// Whether reduce_gradient moves any data for this weight.
bool reduce_moves_data(const Config& cfg, const Mesh& mesh, const std::string& name);

// f32 gradients in the needed layout -> gradients of the stored shards, summed
// over every rank that holds a partial (router: all ranks; experts: the data
// and fsdp axes), in world rank order.
LayerWeights reduce_gradients(const Config& cfg, const Mesh& mesh, const LayerWeights& needed_grads,
                              GatherMode mode);

}  // namespace moe
