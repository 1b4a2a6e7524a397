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
  // Inlined whole, the denormal vectors' path included, so the row loops inline their bf16 stores
  // and no call is left in a tile's epilogue: the x86-64 ABI saves no vector register across a call,
  // and with one after the loop GCC 12 kept three of the 6 x 4 bf16 tile's 24 accumulators on the
  // stack through every step (a load and a store each per step): avx512_bf16's bf16-output GEMMs ran
  // 1.3x slower on a Zen 5 (docs/benchmarks.md, 2026-12-08). scripts/check_tile_loops.py checks it.
  [[gnu::always_inline]] static __m256i round_bf16(F v) {
    if (_mm512_fpclass_ps_mask(v, 0x20)) [[unlikely]]  // 0x20: denormal
      return Avx512::round_bf16(v);
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  }
  static void store_bf16(bf16* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16(v)); }
  static void store_bf16_n(bf16* p, F v, int64_t n) { _mm256_mask_storeu_epi16(p, first(n), round_bf16(v)); }
};

}  // namespace moe::x86
