// The variants of `moe bench --dist`: the seed's benchmark table (SPEC.md §6)
// plus the chunked ones where a chunk's communication can overlap another
// chunk's compute, and the 2-rank ones of the overlap demo (scripts/overlap.sh).
#include <algorithm>

#include "bench/dist_bench.h"
#include "distributed/mesh_variants.h"

namespace moe::bench {
namespace {

void off_fsdp(Config& c) { c.moe_offload_targets = "fsdp_all_gather"; }
void off_ep(Config& c) { c.moe_offload_targets = "ep_collectives"; }
void off_sort(Config& c) { c.moe_offload_targets = "ragged_sort"; }
void off_all(Config& c) { c.moe_offload_targets = "all"; }
void chunks4(Config& c) { c.num_moe_token_chunks = 4; }
void chunks4_all(Config& c) { chunks4(c), off_all(c); }
void ring_chunks4(Config& c) { c.use_ring_of_experts = true, chunks4(c); }
void ring_chunks4_all(Config& c) { ring_chunks4(c), off_all(c); }
// One rank doing what one rank of ep2 does: E/2 experts on its own tokens' T*K rows, 4 chunks.
void half_experts_chunks4(Config& c) { c.num_experts /= 2, chunks4(c); }
void hier(Config& c) { c.ep_all_to_all = EpAllToAll::hierarchical; }
void hier_chunks4_all(Config& c) { hier(c), chunks4_all(c); }

std::vector<DistVariant> make() {
  return {
      {"baseline_fsdp4", 1, 4, 1, nullptr, "", "FSDP over 4 ranks, boundary gather"},
      {"fsdp4+fsdp_all_gather", 1, 4, 1, off_fsdp, "baseline_fsdp4", "weight gathers on the side engine"},
      {"baseline_ep4", 1, 1, 4, nullptr, "", "expert parallelism over 4 ranks (ragged all-to-all)"},
      {"ep4+ep_collectives", 1, 1, 4, off_ep, "baseline_ep4", "count exchanges and all-to-alls on the side engine"},
      {"ep4+ragged_sort", 1, 1, 4, off_sort, "baseline_ep4", "routing index math on the side engine"},
      {"ep4+all", 1, 1, 4, off_all, "baseline_ep4", "every target live"},
      {"baseline_fsdp2_ep2", 1, 2, 2, nullptr, "", "FSDP 2 x EP 2"},
      {"fsdp2_ep2+all", 1, 2, 2, off_all, "baseline_fsdp2_ep2", "every target live"},
      {"baseline_ep4_chunks4", 1, 1, 4, chunks4, "", "ep4 in 4 token chunks"},
      {"ep4_chunks4+all", 1, 1, 4, chunks4_all, "baseline_ep4_chunks4", "4 chunks pipelined, every target live"},
      {"baseline_ring4_chunks4", 1, 1, 4, ring_chunks4, "", "ring of experts over 4 ranks, 4 chunks"},
      {"ring4_chunks4+all", 1, 1, 4, ring_chunks4_all, "baseline_ring4_chunks4", "ring, 4 chunks, every target"},
      {"compute_only_ep2_chunks4", 1, 1, 1, half_experts_chunks4, "",
       "one rank's compute of ep2_chunks4 alone (E/2 experts, T*K rows, no communication)"},
      {"baseline_ep2_chunks4", 1, 1, 2, chunks4, "", "ep2 in 4 token chunks"},
      {"ep2_chunks4+all", 1, 1, 2, chunks4_all, "baseline_ep2_chunks4", "ep2, 4 chunks pipelined, every target"},
      {"baseline_ring2_chunks4", 1, 1, 2, ring_chunks4, "", "ring of experts over 2 ranks, 4 chunks"},
      {"ring2_chunks4+all", 1, 1, 2, ring_chunks4_all, "baseline_ring2_chunks4", "ring over 2, 4 chunks, every target"},
      // Hierarchical all-to-all: two phases when the expert group spans several hosts (MOE_RANKS_PER_HOST=2
      // on one machine: 2 hosts x 2 ranks), else the flat exchange.
      {"ep4_hier", 1, 1, 4, hier, "baseline_ep4", "ep4, ep_all_to_all=hierarchical"},
      {"ep4_hier_chunks4+all", 1, 1, 4, hier_chunks4_all, "ep4_chunks4+all", "ep4_hier, 4 chunks pipelined, every target"},
  };
}

}  // namespace

const std::vector<DistVariant>& dist_variants() {
  static const std::vector<DistVariant> v = make();
  return v;
}

std::vector<DistVariant> select_dist_variants(const std::vector<std::string>& names) {
  return select_mesh_variants(dist_variants(), names, &DistVariant::baseline);
}

Config dist_variant_config(const Config& base, const DistVariant& v) { return mesh_variant_config(base, v); }

Config dist_bench_config(const std::vector<std::string>& overrides) {
  const char* yaml = "num_experts: 8\nnum_experts_per_tok: 2\nemb_dim: 1024\nmoe_mlp_dim: 512\ndtype: bf16\n";
  return parse_config(yaml, "<moe bench --dist>", overrides).config;
}

}  // namespace moe::bench
