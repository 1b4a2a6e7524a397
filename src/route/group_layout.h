// Groups of consecutive rows, one per expert: the layout the routing index
// math produces (route/routing.h) and the grouped GEMM consumes
// (kernels/grouped_gemm.h). It belongs to routing; the kernels only read it.
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

struct GroupLayout {
  std::vector<int64_t> sizes;    // [G] rows per global group
  std::vector<int64_t> offsets;  // [G+1] exclusive cumsum; offsets[G] = total rows in groups
  static GroupLayout from_sizes(const std::vector<int64_t>& sizes);
  int64_t num_groups() const { return int64_t(sizes.size()); }
  int64_t total() const { return offsets.back(); }
};

}  // namespace moe
