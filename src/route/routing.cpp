#include "route/routing.h"

#include <algorithm>
#include <cmath>

#include "moe/error.h"

namespace moe {

int64_t expert_capacity(int64_t tokens, int64_t top_k, int64_t experts, double capacity_factor) {
  if (capacity_factor <= 0) return -1;
  return int64_t(std::ceil(double(tokens * top_k) / double(experts) * capacity_factor));
}

Routing compute_routing(const int32_t* idx, int64_t T, int64_t K, int64_t E, int64_t capacity,
                        const std::vector<int64_t>* prior) {
  const int64_t R = T * K;
  Routing rt;
  rt.tokens = T;
  rt.top_k = K;
  rt.experts = E;
  rt.routed_counts.assign(size_t(E), 0);
  for (int64_t r = 0; r < R; ++r) {
    MOE_ASSERT(idx[r] >= 0 && idx[r] < E, "expert id out of range");
    rt.routed_counts[size_t(idx[r])]++;
  }
  std::vector<int64_t> kept(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    kept[size_t(e)] = capacity < 0 ? rt.routed_counts[size_t(e)]
                                   : std::clamp(capacity - (prior ? (*prior)[size_t(e)] : 0), int64_t(0),
                                                rt.routed_counts[size_t(e)]);
  rt.groups = GroupLayout::from_sizes(kept);
  // Scatter slots: the first `kept[e]` slots of expert e (in flat order) go to
  // its group, later ones to the dropped tail.
  std::vector<int64_t> cursor(rt.groups.offsets.begin(), rt.groups.offsets.end() - 1);
  std::vector<int64_t> seen(size_t(E), 0);
  int64_t tail = rt.groups.total();
  rt.order.resize(size_t(R));
  rt.inv.resize(size_t(R));
  for (int64_t r = 0; r < R; ++r) {
    size_t e = size_t(idx[r]);
    int64_t row = seen[e]++ < kept[e] ? cursor[e]++ : tail++;
    rt.order[size_t(row)] = int32_t(r);
    rt.inv[size_t(r)] = int32_t(row);
  }
  rt.dropped = R - rt.groups.total();
  return rt;
}

}  // namespace moe
