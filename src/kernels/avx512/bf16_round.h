// f32 -> bf16 round to nearest even on 16 lanes, bit for bit as moe::to_bf16
// (include/moe/dtype.h): denormals are rounded like any other value and a NaN
// keeps its high half with the quiet bit set. (VCVTNEPS2BF16 is not used: it
// flushes denormal inputs to zero.) Included only after the AVX-512 target pragma.
#pragma once

#include <immintrin.h>

namespace moe::avx512 {

inline __m256i round_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40)));
}

}  // namespace moe::avx512
