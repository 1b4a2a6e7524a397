#include "route/group_layout.h"

#include "moe/error.h"

namespace moe {

GroupLayout GroupLayout::from_sizes(const std::vector<int64_t>& sizes) {
  GroupLayout g;
  g.sizes = sizes;
  g.offsets.assign(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    MOE_ASSERT(sizes[i] >= 0, "negative group size");
    g.offsets[i + 1] = g.offsets[i] + sizes[i];
  }
  return g;
}

}  // namespace moe
