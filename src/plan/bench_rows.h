// The expert rows of each rank in `moe bench --dist`'s step of a variant
// (src/bench/dist_bench.cpp): the bench routes each rank's own inputs
// (case_inputs(seed, rank + 1)) through the router of init_weights(cfg, seed),
// so the rows an expert-parallel rank computes per chunk are not T·K/chunks but
// what that routing sends its experts. `moe plan --bench-variant` takes them,
// since a step runs at the pace of its slowest rank.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/config.h"

namespace moe::plan {

// rows[r][c]: routed rows (token, slot) that rank r's experts receive in chunk c, from every rank
// of r's expert group (the ranks sharing r / expert; rank = group * expert + e, mesh order);
// `chunks` even chunks of T tokens per rank (T*c/n .. T*(c+1)/n, as DistLayer splits them).
std::vector<std::vector<int64_t>> bench_expert_rows(const Config& cfg, int ranks, int expert, int64_t T,
                                                    int chunks, uint64_t seed);

}  // namespace moe::plan
