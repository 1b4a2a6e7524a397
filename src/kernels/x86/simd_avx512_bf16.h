// Vector traits of the levels with AVX-512 BF16 (avx512_bf16, amx_bf16): the
// AVX-512 traits with bf16 rounding by VCVTNEPS2BF16, one instruction where
// Avx512::round_bf16 takes nine. That instruction rounds to nearest even and
// quiets NaN as moe::to_bf16 does (every f32 compared, 2026-12-07), but treats
// denormal inputs as zero: a vector with a denormal lane takes Avx512's
// rounding instead. Include only inside such a level's target region.
#pragma once

#include "kernels/x86/simd_avx512.h"

namespace moe::x86 {

struct Avx512Bf16 : Avx512 {
  // The denormal vectors' path out of line, so the rounding stays small enough to inline into the
  // row loops (their stores were calls otherwise).
  [[gnu::noinline, gnu::cold]] static __m256i round_bf16_exact(F v) { return Avx512::round_bf16(v); }
  [[gnu::always_inline]] static __m256i round_bf16(F v) {
    if (_mm512_fpclass_ps_mask(v, 0x20)) [[unlikely]]  // 0x20: denormal
      return round_bf16_exact(v);
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  }
  static void store_bf16(bf16* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16(v)); }
  static void store_bf16_n(bf16* p, F v, int64_t n) { _mm256_mask_storeu_epi16(p, first(n), round_bf16(v)); }
};

}  // namespace moe::x86
