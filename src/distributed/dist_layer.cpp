#include "moe/dist_layer.h"

#include <cstring>

#include "distributed/dist_step.h"
#include "distributed/dist_weights.h"

namespace moe {

void DistForwardDeleter::operator()(DistForward* p) const { delete p; }

namespace {
// Serialized AuxStats of one rank: E prob sums, E routed counts, lse sum, then the int64s tokens,
// nonfinite and lse_overflow (the flags travel in the same all-gather: one message, as before).
constexpr size_t kStatsInts = 3;
size_t stats_bytes(int64_t E) {
  return size_t(E) * (sizeof(FixedSum) + 8) + sizeof(FixedSum) + kStatsInts * 8;
}

void pack_stats(const AuxStats& s, std::byte* p) {
  const size_t E = s.prob_sum.size();
  const int64_t ints[kStatsInts] = {s.tokens, s.nonfinite, s.lse_overflow};
  std::memcpy(p, s.prob_sum.data(), E * sizeof(FixedSum));
  std::memcpy(p + E * sizeof(FixedSum), s.routed_counts.data(), E * 8);
  std::memcpy(p + E * (sizeof(FixedSum) + 8), &s.lse_sq_sum, sizeof(FixedSum));
  std::memcpy(p + E * (sizeof(FixedSum) + 8) + sizeof(FixedSum), ints, sizeof(ints));
}

void unpack_stats(const std::byte* p, AuxStats& s) {
  const size_t E = s.prob_sum.size();
  int64_t ints[kStatsInts];
  std::memcpy(s.prob_sum.data(), p, E * sizeof(FixedSum));
  std::memcpy(s.routed_counts.data(), p + E * sizeof(FixedSum), E * 8);
  std::memcpy(&s.lse_sq_sum, p + E * (sizeof(FixedSum) + 8), sizeof(FixedSum));
  std::memcpy(ints, p + E * (sizeof(FixedSum) + 8) + sizeof(FixedSum), sizeof(ints));
  s.tokens = ints[0];
  s.nonfinite = ints[1];
  s.lse_overflow = ints[2];
}
}  // namespace

AuxStats gather_stats(Communicator& world, const AuxStats& local, std::vector<int64_t>& prior) {
  const int64_t E = int64_t(local.prob_sum.size());
  const size_t nb = stats_bytes(E);
  std::vector<std::byte> mine(nb), all(nb * size_t(world.size()));
  pack_stats(local, mine.data());
  world.all_gather(mine.data(), all.data(), nb);
  AuxStats global = local;
  prior.assign(size_t(E), 0);
  for (int r = 0; r < world.size(); ++r) {
    AuxStats s = local;
    unpack_stats(all.data() + nb * size_t(r), s);
    if (r == 0) global = s;
    else global.add(s);
    if (r < world.rank())
      for (int64_t e = 0; e < E; ++e) prior[size_t(e)] += s.routed_counts[size_t(e)];
  }
  return global;
}

MeshShape check_parallel_config(const Config& cfg, int world_size) {
  MeshShape m = resolve_mesh_shape(cfg.data_parallelism, cfg.fsdp_parallelism, cfg.expert_parallelism, world_size);
  const int64_t E = cfg.num_experts, D = cfg.emb_dim;
  if (E % m.expert) fail("num_experts=", E, " is not divisible by expert_parallelism=", m.expert);
  if (cfg.use_ring_of_experts && m.expert == 1)
    fail("use_ring_of_experts=true needs expert_parallelism > 1 (it runs over the expert axis)");
  if (cfg.use_ring_of_experts && cfg.ragged_buffer_factor > 0)
    fail("ragged_buffer_factor=", cfg.ragged_buffer_factor, " caps the all-to-all buffer; the ring of experts has none ",
         "(use -1 with use_ring_of_experts=true)");
  if (cfg.moe_split_expert_weight_layout) {
    if (m.expert != 1) fail("moe_split_expert_weight_layout=true needs expert_parallelism=1 (got ", m.expert, ")");
    if (E % m.fsdp) fail("moe_split_expert_weight_layout shards num_experts=", E, " over fsdp=", m.fsdp, ": not divisible");
  } else if (cfg.shard_exp_on_fsdp) {
    if (E % (int64_t(m.expert) * m.fsdp))
      fail("shard_exp_on_fsdp shards num_experts=", E, " over expert*fsdp=", m.expert * m.fsdp, ": not divisible");
  } else if (D % m.fsdp) {
    fail("emb_dim=", D, " is not divisible by fsdp_parallelism=", m.fsdp, " (expert weights shard D over fsdp)");
  }
  return m;
}

DistLayer::DistLayer(const Config& cfg, const Mesh& mesh, bool explicit_fsdp_plan, StepTrace* trace)
    : cfg_(cfg),
      mesh_(mesh),
      explicit_plan_(explicit_fsdp_plan),
      rt_(nullptr),
      trace_(trace),
      hier_a2a_(use_hierarchical_a2a(cfg, mesh)) {}

DistLayer::DistLayer(const Config& cfg, const DistRuntime& rt)
    : cfg_(cfg),
      mesh_(rt.mesh()),
      explicit_plan_(rt.offload().is_live(OffloadTarget::fsdp_all_gather)),
      rt_(&rt),
      trace_(nullptr),
      hier_a2a_(use_hierarchical_a2a(cfg, rt.mesh())) {}

LayerWeights DistLayer::shard(const LayerWeights& full) const { return shard_weights(cfg_, mesh_, full); }

LayerWeights DistLayer::unshard_to_root(const LayerWeights& shards) const {
  return moe::unshard_to_root(cfg_, mesh_, shards);
}

}  // namespace moe
