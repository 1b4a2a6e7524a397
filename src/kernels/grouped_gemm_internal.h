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

// AVX-512 kernels (F/BW/VL/DQ + FMA; bf16 inputs also need AVX512-BF16).
// REQUIRES: arguments already checked, supports(input dtype).
namespace moe::avx512 {
// Whether this CPU runs the AVX-512 kernels for inputs of dtype `in`
// (read once from cpuid; MOE_GEMM_ISA=reference forces the reference).
bool supports(DType in);
void gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset, Tensor& out);
void gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
              Tensor& dlhs);
void gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t group_offset,
              Tensor& drhs);
}  // namespace moe::avx512
