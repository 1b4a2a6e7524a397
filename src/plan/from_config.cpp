#include "plan/from_config.h"

#include <algorithm>

#include "moe/mesh.h"

namespace moe::plan {

LayerShape shape_of(const Config& cfg, int64_t T, const std::string& name) {
  LayerShape L;
  L.name = name;
  L.T = T, L.D = cfg.emb_dim, L.F = cfg.moe_mlp_dim, L.E = cfg.num_experts, L.K = cfg.num_experts_per_tok;
  L.dtype = cfg.dtype, L.weight_dtype = cfg.weight_dtype;
  return L;
}

Layout layout_of(const Config& cfg, int ranks, A2AAlgo a2a) {
  const MeshShape m =
      resolve_mesh_shape(cfg.data_parallelism, cfg.fsdp_parallelism, cfg.expert_parallelism, ranks, true);
  Layout l;
  l.data = m.data, l.fsdp = m.fsdp, l.expert = m.expert;
  l.chunks = int(std::max<int64_t>(cfg.num_moe_token_chunks, 1));
  l.ring = cfg.use_ring_of_experts;
  for (const std::string& t : parse_offload_targets(cfg.moe_offload_targets)) {
    l.off_fsdp |= t == "fsdp_all_gather";
    l.off_ep |= t == "ep_collectives";
    l.off_sort |= t == "ragged_sort";
  }
  // As the engine: a target that moves nothing here stays off (ep with one expert rank, fsdp with one shard).
  if (l.expert == 1) l.off_ep = false;
  if (l.fsdp == 1 && l.data == 1) l.off_fsdp = false;
  l.a2a = a2a;
  return l;
}

}  // namespace moe::plan
