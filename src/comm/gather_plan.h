// FSDP weight gathers planned from shard specs (SPEC.md §3, MAXTEXT_NOTES §3.3).
//
// A plan is a list of (dim, axes): all-gather dimension `dim` over the mesh
// axes `axes` (major first), tiled: shards concatenate along dim in the rank
// order of mesh.comm(axes). Its backward is the deterministic reduce-scatter
// of the full-size gradient back to the shard, in reverse plan order.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe/mesh.h"
#include "moe/tensor.h"

namespace moe {

using GatherPlan = std::vector<std::pair<int, std::vector<std::string>>>;

// The gathers that turn a tensor stored as `stored` into `needed` (ndim
// dims; specs shorter than ndim are padded with replicated dims). Per dim:
// equal -> nothing; else `needed` must be a prefix of `stored` -> gather over
// stored[len(needed):]; otherwise nullopt (gaining an axis, swapping axes or
// dropping a major axis is not a pure tiled all-gather). Identical specs give
// an empty plan. A spec longer than ndim is an error.
std::optional<GatherPlan> all_gather_plan(const ShardSpec& stored, const ShardSpec& needed, int ndim);

// Tiled all-gather of `local` along `dim` over `comm`: the result's dim is
// comm.size() times larger, blocks in rank order. One AG on the counters.
Tensor all_gather_dim(Communicator& comm, const Tensor& local, int dim);
// Deterministic tiled reduce-scatter (f32): sums `full` over comm in rank
// order and keeps block comm.rank() of dim (dim % comm.size() == 0). One RS.
Tensor reduce_scatter_dim(Communicator& comm, const Tensor& full, int dim);

// Runs the plan's gathers on this rank's shard (one AG per entry).
Tensor gather_by_plan(const Mesh& mesh, const Tensor& shard, const GatherPlan& plan);
// Backward of gather_by_plan: f32 gradient of the gathered tensor -> f32
// gradient of the shard (one RS per entry, reverse order).
Tensor reduce_scatter_by_plan(const Mesh& mesh, const Tensor& full_grad, const GatherPlan& plan);

// This rank's shard of a full tensor laid out as `spec` on `mesh` (a copy;
// each sharded dim must divide by the product of its axes' extents).
Tensor local_shard(const Mesh& mesh, const Tensor& full, const ShardSpec& spec);
// The shard of the rank at `coords`.
Tensor shard_at(const MeshShape& shape, const MeshCoords& coords, const Tensor& full, const ShardSpec& spec);

// Deterministic "sum, then keep my shard" in ONE collective (one RS on the
// counters): sums the f32 full-size gradients of every rank of
// mesh.comm(sum_axes) in world rank order and returns this rank's shard as
// laid out by `spec`. Bit-identical to all_reduce_sum over the same group
// followed by local_shard (the boundary-gather baseline), whatever the
// grouping of the plan's axes. Cost: sends each member of the group its
// shard (group size x shard bytes), more than a plain reduce-scatter when the
// group includes axes the spec does not shard over.
Tensor reduce_to_shard(const Mesh& mesh, const Tensor& full_grad, const ShardSpec& spec,
                       const std::vector<std::string>& sum_axes);

}  // namespace moe
