// Internal pieces of the grouped GEMM shared by the public entry points
// (grouped_gemm.cpp), the reference twin and the AVX-512 kernels.
#pragma once

#include <cstdint>

#include "kernels/grouped_gemm.h"

namespace moe::detail {

// Argument checks of each op; throw moe::Error naming the op.
void check_gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
               const Tensor& out);
void check_gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
                    const Tensor& dlhs);
void check_gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t group_offset,
                    const Tensor& drhs);

}  // namespace moe::detail
