// AVX-512 weighted row sum for the combine and the permute's backward
// (declared in kernels/row_ops.h, dispatched by rows::weighted_sum).
//
// Same bits as the portable loop: per element, acc = 0, then acc = acc +
// w[k] * src[k][d] for k = 0..K-1 (a rounded product, then a rounded add: no
// fma), then one RNE rounding to the output type (NaN kept quiet, exactly as
// store_as<bf16>). The gain over the auto-vectorized fill / axpy / store
// passes is that the sum stays in registers: one read of each source row and
// one write of the output, ~1.3 instructions per output element instead of ~4.
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512/row_ops_avx512.h"
#include "moe/dtype.h"

#include "kernels/avx512/target_begin.h"

#include "kernels/avx512/bf16_round.h"

namespace moe::avx512 {
namespace {

__mmask16 first16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

__m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
__m512 load16(const bf16* p, __mmask16 m) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
void store16(bf16* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, round_to_bf16(v)); }

template <class S, class O>
void weighted_sum_impl(const float* w, const S* const* src, int64_t K, O* dst, int64_t D, const S* const* next) {
  constexpr int kB = 4;  // 64 elements per step: four independent add chains
  int64_t d = 0;
  for (; d + 16 * kB <= D; d += 16 * kB) {
    __m512 acc[kB];
    for (int b = 0; b < kB; ++b) acc[b] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const __m512 wk = _mm512_set1_ps(w[k]);
      const S* s = src[k] + d;
      for (int b = 0; b < kB; ++b) acc[b] = _mm512_add_ps(acc[b], _mm512_mul_ps(wk, load16(s + 16 * b, 0xffff)));
      if (next) {
        const char* p = reinterpret_cast<const char*>(next[k] + d);
        for (int64_t off = 0; off < int64_t(16 * kB * sizeof(S)); off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
      }
    }
    for (int b = 0; b < kB; ++b) store16(dst + d + 16 * b, acc[b], 0xffff);
  }
  for (; d < D; d += 16) {
    const __mmask16 m = first16(D - d);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k)
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(w[k]), load16(src[k] + d, m)));
    store16(dst + d, acc, m);
  }
}

}  // namespace

void weighted_sum(const float* w, const bf16* const* src, int64_t K, bf16* dst, int64_t D, const bf16* const* next) {
  weighted_sum_impl(w, src, K, dst, D, next);
}
void weighted_sum(const float* w, const bf16* const* src, int64_t K, float* dst, int64_t D, const bf16* const* next) {
  weighted_sum_impl(w, src, K, dst, D, next);
}
void weighted_sum(const float* w, const float* const* src, int64_t K, float* dst, int64_t D, const float* const* next) {
  weighted_sum_impl(w, src, K, dst, D, next);
}

}  // namespace moe::avx512

#include "kernels/avx512/target_end.h"
