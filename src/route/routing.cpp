#include "route/routing.h"

#include <algorithm>
#include <cmath>

#include "moe/error.h"

namespace moe {

int64_t expert_capacity(int64_t tokens, int64_t top_k, int64_t experts, double capacity_factor) {
  if (capacity_factor <= 0) return -1;
  return int64_t(std::ceil(double(tokens * top_k) / double(experts) * capacity_factor));
}

namespace {

// The counting sort shared by both entry points: kept slots grouped by expert
// (flat order inside a group), then the dropped ones in flat order.
Routing sort_slots(const int32_t* idx, int64_t T, int64_t K, int64_t E, const std::vector<uint8_t>& keep) {
  const int64_t R = T * K;
  Routing rt;
  rt.tokens = T;
  rt.top_k = K;
  rt.experts = E;
  rt.routed_counts.assign(size_t(E), 0);
  std::vector<int64_t> kept(size_t(E), 0);
  for (int64_t r = 0; r < R; ++r) {
    MOE_ASSERT(idx[r] >= 0 && idx[r] < E, "expert id out of range");
    rt.routed_counts[size_t(idx[r])]++;
    kept[size_t(idx[r])] += keep[size_t(r)];
  }
  rt.groups = GroupLayout::from_sizes(kept);
  std::vector<int64_t> cursor(rt.groups.offsets.begin(), rt.groups.offsets.end() - 1);
  int64_t tail = rt.groups.total();
  rt.order.resize(size_t(R));
  rt.inv.resize(size_t(R));
  for (int64_t r = 0; r < R; ++r) {
    int64_t row = keep[size_t(r)] ? cursor[size_t(idx[r])]++ : tail++;
    rt.order[size_t(row)] = int32_t(r);
    rt.inv[size_t(r)] = int32_t(row);
  }
  rt.dropped = R - rt.groups.total();
  return rt;
}

}  // namespace

Routing compute_routing(const int32_t* idx, int64_t T, int64_t K, int64_t E, int64_t capacity,
                        const std::vector<int64_t>* prior) {
  // A slot is kept while its expert has capacity left: the earlier slots of
  // the global order (prior, then this call's flat order) use it up first.
  std::vector<uint8_t> keep(size_t(T * K), 1);
  if (capacity >= 0) {
    std::vector<int64_t> used = prior ? *prior : std::vector<int64_t>(size_t(E), 0);
    for (int64_t r = 0; r < T * K; ++r) {
      MOE_ASSERT(idx[r] >= 0 && idx[r] < E, "expert id out of range");
      keep[size_t(r)] = used[size_t(idx[r])]++ < capacity;
    }
  }
  return sort_slots(idx, T, K, E, keep);
}

Routing compute_routing_masked(const int32_t* idx, int64_t T, int64_t K, int64_t E, const uint8_t* keep) {
  return sort_slots(idx, T, K, E, std::vector<uint8_t>(keep, keep + T * K));
}

std::vector<uint8_t> keep_mask(const Routing& rt) {
  std::vector<uint8_t> m(rt.order.size());
  for (size_t r = 0; r < m.size(); ++r) m[r] = rt.inv[r] < rt.groups.total();
  return m;
}

}  // namespace moe
