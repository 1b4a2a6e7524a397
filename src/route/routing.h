// Routing index math (SPEC.md §2 step 3; the `ragged_sort` offload target):
// a stable sort of the flat slots by expert, group sizes and offsets, the
// inverse permutation, and capacity dropping. Integer-only, so every
// implementation agrees bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "route/group_layout.h"

namespace moe {

struct Routing {
  int64_t tokens = 0, top_k = 0, experts = 0;
  // order[row] = flat slot (t*K + k) placed at sorted row `row`. Kept slots
  // come first, grouped by expert (stable: token then slot order); dropped
  // slots follow, in flat order.
  std::vector<int32_t> order;          // [R]
  std::vector<int32_t> inv;            // [R] inv[order[row]] = row
  std::vector<int64_t> routed_counts;  // [E] slots routed to each expert, before dropping
  GroupLayout groups;                  // kept rows per expert (sizes [E], offsets [E+1])
  int64_t dropped = 0;                 // slots dropped by capacity
  int64_t rows() const { return int64_t(order.size()); }
};

// C = ceil(T*K/E * capacity_factor) when capacity_factor > 0, else -1 (dropless).
int64_t expert_capacity(int64_t tokens, int64_t top_k, int64_t experts, double capacity_factor);

// topk_idx: [T*K] flat expert ids (token-major). capacity < 0: dropless.
// `prior` (optional, [E]): slots routed to each expert by tokens that come
// earlier in the global token order (other ranks, earlier chunks); they use
// up capacity first, so the globally earliest slots are kept.
// Counting sort: O(R + E), stable.
Routing compute_routing(const int32_t* topk_idx, int64_t tokens, int64_t top_k, int64_t experts,
                        int64_t capacity, const std::vector<int64_t>* prior = nullptr);

// Same sort with the kept slots given (keep[r] != 0), e.g. decided by the
// ranks that own the tokens (ring of experts).
Routing compute_routing_masked(const int32_t* topk_idx, int64_t tokens, int64_t top_k, int64_t experts,
                               const uint8_t* keep);

// keep[r] = 1 iff slot r is kept in `rt`.
std::vector<uint8_t> keep_mask(const Routing& rt);

}  // namespace moe
