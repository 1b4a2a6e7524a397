// The AVX-512 row kernel behind rows::weighted_sum (kernels/row_ops.h), which
// dispatches to it when avx512::supports(DType::f32). Same contract and bits.
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe::avx512 {
void weighted_sum(const float* w, const bf16* const* src, int64_t K, bf16* dst, int64_t D, const bf16* const* next);
void weighted_sum(const float* w, const bf16* const* src, int64_t K, float* dst, int64_t D, const bf16* const* next);
void weighted_sum(const float* w, const float* const* src, int64_t K, float* dst, int64_t D, const float* const* next);
}  // namespace moe::avx512
