#include "check/variants.h"

#include "distributed/mesh_variants.h"

namespace moe::check {
namespace {

using CR = CounterpartRule;

void chunks4(Config& c) { c.num_moe_token_chunks = 4; }
void reference_kernels(Config& c) { c.moe_permute_kernel = c.moe_combine_kernel = KernelChoice::reference; }
void split_layout(Config& c) { c.prefuse_moe_weights = c.moe_split_expert_weight_layout = true; }
void shard_exp(Config& c) { c.shard_exp_on_fsdp = true; }
void capacity1(Config& c) { c.capacity_factor = 1.0; }
void ring(Config& c) { c.use_ring_of_experts = true; }
void ring_chunks4(Config& c) { c.use_ring_of_experts = true; c.num_moe_token_chunks = 4; }
void off_fsdp(Config& c) { c.moe_offload_targets = "fsdp_all_gather"; }
void off_ep(Config& c) { c.moe_offload_targets = "ep_collectives"; }
void off_sort(Config& c) { c.moe_offload_targets = "ragged_sort"; }
void off_all(Config& c) { c.moe_offload_targets = "all"; }
void chunks4_all(Config& c) { c.num_moe_token_chunks = 4; c.moe_offload_targets = "all"; }
void ring_all(Config& c) { ring(c); off_all(c); }
void ring_chunks4_all(Config& c) { ring_chunks4(c); off_all(c); }
void split_all(Config& c) { split_layout(c); off_all(c); }
void hier(Config& c) { c.ep_all_to_all = EpAllToAll::hierarchical; }
void hier_chunks4(Config& c) { hier(c); chunks4(c); }
void hier_all(Config& c) { hier(c); off_all(c); }
void hier_chunks4_all(Config& c) { hier(c); chunks4_all(c); }

std::vector<VariantSpec> make_variants() {
  return {
      {"single", 1, 1, 1, nullptr, false, "", CR::none,
       "the distributed layer on one rank (the reference itself)"},
      {"fsdp2", 1, 2, 1, nullptr, false, "", CR::none, "FSDP over 2 ranks, boundary gather"},
      {"fsdp4", 1, 4, 1, nullptr, false, "", CR::none, "FSDP over 4 ranks, boundary gather"},
      {"ep2", 1, 1, 2, nullptr, false, "", CR::none, "expert parallelism over 2 ranks (ragged all-to-all)"},
      {"ep4", 1, 1, 4, nullptr, false, "", CR::none, "expert parallelism over 4 ranks"},
      {"fsdp2_ep2", 1, 2, 2, nullptr, false, "", CR::none, "FSDP 2 x EP 2"},
      {"data2_ep2", 2, 1, 2, nullptr, false, "", CR::none, "data parallelism 2 x EP 2"},
      {"ep2_chunks4", 1, 1, 2, chunks4, false, "ep2", CR::everything, "ep2 in 4 token chunks"},
      {"ep4_chunks4", 1, 1, 4, chunks4, false, "ep4", CR::everything, "ep4 in 4 token chunks"},
      {"ep2_reference_kernels", 1, 1, 2, reference_kernels, false, "ep2", CR::activations,
       "ep2 with moe_permute_kernel/moe_combine_kernel=reference"},
      {"fsdp2_split", 1, 2, 1, split_layout, false, "", CR::none,
       "prefused wi in the split layout [2, E, D/2, 2F], E sharded over fsdp 2"},
      {"fsdp4_split", 1, 4, 1, split_layout, false, "", CR::none, "split layout over fsdp 4"},
      {"fsdp2_shard_exp", 1, 2, 1, shard_exp, false, "", CR::none,
       "shard_exp_on_fsdp: E (not D) over fsdp 2"},
      {"ep2_capacity", 1, 1, 2, capacity1, false, "", CR::none,
       "ep2 with capacity_factor 1.0 (slots dropped)"},
      {"fsdp2_explicit", 1, 2, 1, nullptr, true, "fsdp2", CR::everything,
       "fsdp2 with the explicit FSDP gather plan (what fsdp_all_gather selects)"},
      {"fsdp4_explicit", 1, 4, 1, nullptr, true, "fsdp4", CR::everything, "fsdp4 with the explicit plan"},
      {"fsdp2_ep2_explicit", 1, 2, 2, nullptr, true, "fsdp2_ep2", CR::everything,
       "fsdp2_ep2 with the explicit plan"},
      {"ep2_ring", 1, 1, 2, ring, false, "", CR::none, "ring of experts over 2 ranks"},
      {"ep4_ring", 1, 1, 4, ring, false, "", CR::none, "ring of experts over 4 ranks"},
      {"ep4_ring_chunks4", 1, 1, 4, ring_chunks4, false, "ep4_ring", CR::everything, "ring of experts, 4 token chunks"},
      // The seed's table: every live offload target against offload off, bit for bit.
      {"fsdp4+fsdp_all_gather", 1, 4, 1, off_fsdp, false, "fsdp4", CR::everything,
       "fsdp4, weight gathers (explicit plan) and their reduce-scatters on the side engine"},
      {"fsdp4_split+all", 1, 4, 1, split_all, false, "fsdp4_split", CR::everything,
       "split layout, each expert half gathered on the side engine while the other half's GEMM runs"},
      {"ep4+ep_collectives", 1, 1, 4, off_ep, false, "ep4", CR::everything,
       "ep4, count exchanges and ragged all-to-alls on the side engine"},
      {"ep4+ragged_sort", 1, 1, 4, off_sort, false, "ep4", CR::everything, "ep4, routing index math on the side engine"},
      {"ep4+all", 1, 1, 4, off_all, false, "ep4", CR::everything, "ep4, every target live"},
      {"ep4_chunks4+all", 1, 1, 4, chunks4_all, false, "ep4_chunks4", CR::everything,
       "ep4, 4 chunks pipelined: a chunk's all-to-alls overlap another's FFN"},
      {"fsdp2_ep2+all", 1, 2, 2, off_all, false, "fsdp2_ep2", CR::everything, "fsdp2 x ep2, every target live"},
      {"ep2_ring+all", 1, 1, 2, ring_all, false, "ep2_ring", CR::everything, "ring of experts, every target live"},
      {"ep4_ring_chunks4+all", 1, 1, 4, ring_chunks4_all, false, "ep4_ring_chunks4", CR::everything,
       "ring of experts + 4 chunks + every target"},
      // The hierarchical all-to-all (docs/distributed.md): 2 phases per all-to-all when the expert
      // group spans several hosts (the suite's check_np4_hier: MOE_RANKS_PER_HOST=2, 2 hosts x 2 ranks);
      // on one host it is the flat exchange. Bit for bit equal to the flat variant either way.
      {"ep4_hier", 1, 1, 4, hier, false, "ep4", CR::everything,
       "ep4, ep_all_to_all=hierarchical (within hosts, then between them)"},
      {"ep4_hier_chunks4", 1, 1, 4, hier_chunks4, false, "ep4_chunks4", CR::everything,
       "ep4_hier in 4 token chunks"},
      {"ep4_hier+all", 1, 1, 4, hier_all, false, "ep4_hier", CR::everything,
       "ep4_hier, every target live (both phases on the side engine)"},
      {"ep4_hier_chunks4+all", 1, 1, 4, hier_chunks4_all, false, "ep4_hier_chunks4", CR::everything,
       "ep4_hier, 4 chunks pipelined, every target live"},
  };
}

}  // namespace

const std::vector<VariantSpec>& all_variants() {
  static const std::vector<VariantSpec> v = make_variants();
  return v;
}

std::vector<VariantSpec> select_variants(const std::vector<std::string>& names) {
  return select_mesh_variants(all_variants(), names, &VariantSpec::counterpart);
}

Config variant_config(const Config& base, const VariantSpec& v) { return mesh_variant_config(base, v); }

}  // namespace moe::check
