// Vector traits of the AVX-512 levels: 16 f32 lanes in a zmm register, 32
// registers, masked loads and stores for tails. Same members as simd_avx2.h.
// Include only inside an AVX-512 target region (target_avx512*.h).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "moe/dtype.h"

namespace moe::x86 {

struct Avx512 {
  static constexpr int L = 16;
  using F = __m512;
  using I = __m512i;

  static __mmask16 first(int64_t n) {
    return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
  }
  static __mmask64 first_bytes(int64_t n) {
    return n >= 64 ? ~__mmask64(0) : n <= 0 ? __mmask64(0) : (__mmask64(1) << n) - 1;
  }

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float f) { return _mm512_set1_ps(f); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // The activation's lane operations (simd/act_impl.h).
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F neg(F a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
  static F max_else(F a, F b) { return _mm512_max_ps(a, b); }  // a > b ? a : b (b if either is NaN)
  static F min_else(F a, F b) { return _mm512_min_ps(a, b); }  // a < b ? a : b (b if either is NaN)
  // 0.5 with t's sign bit (-0.5 for -0 and a negative NaN): one VPTERNLOGD, (t & sign) | 0.5.
  static F half_with_sign(F t) {
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(INT32_MIN),
                                                         _mm512_set1_epi32(0x3f000000), 0xEA));
  }
  static I trunc_i32(F a) { return _mm512_cvttps_epi32(a); }  // NaN, out of range: INT32_MIN
  static F to_f(I a) { return _mm512_cvtepi32_ps(a); }
  static F pow2(I n) {  // the bits (n + 127) << 23
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  }

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static void stream(float* p, F v) { _mm512_stream_ps(p, v); }
  static void fence() { _mm_sfence(); }  // orders the streamed stores before later stores
  static constexpr int kStreamAlign = 64;

  static F load_bf16_n(const bf16* p, int64_t n) {
    I w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(first(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static F load_bf16(const bf16* p) { return load_bf16_n(p, L); }
  // Round to nearest even exactly as moe::to_bf16 (VCVTNEPS2BF16 is not used:
  // it flushes denormal inputs to zero).
  [[gnu::always_inline]] static __m256i round_bf16(F v) {
    const I u = _mm512_castps_si512(v);
    const I hi = _mm512_srli_epi32(u, 16);
    const I lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const I rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const I abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40)));
  }
  static void store_bf16(bf16* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16(v)); }
  static void store_bf16_n(bf16* p, F v, int64_t n) { _mm256_mask_storeu_epi16(p, first(n), round_bf16(v)); }

  static F bcast_word(uint32_t w) { return _mm512_castsi512_ps(_mm512_set1_epi32(int(w))); }
  static F low_bf16(F w) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(w), 16)); }
  static F high_bf16(F w) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(w), _mm512_set1_epi32(int(0xffff0000u))));
  }

  static I words(const void* p) { return _mm512_loadu_si512(p); }
  static I words_n(const void* p, int64_t nbytes) { return _mm512_maskz_loadu_epi8(first_bytes(nbytes), p); }
  static I u16_n(const uint16_t* p, int64_t n) { return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(first(n), p)); }
  static I shl16(I v) { return _mm512_slli_epi32(v, 16); }
  // Words j in [0, 2L) = (a[j], b[j]) as bf16 pairs, low half a: j < L in lo, the rest in hi.
  // n bf16 of each row are read (at most 2L; zeros past them); b null reads as zeros.
  static void pair_words(const uint16_t* a, const uint16_t* b, int64_t n, I& lo, I& hi) {
    alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                     37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                     11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                     53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                     27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __mmask32 m = n >= 32 ? ~__mmask32(0) : n <= 0 ? __mmask32(0) : (__mmask32(1) << n) - 1;
    const I x = _mm512_maskz_loadu_epi16(m, a);
    const I y = b ? _mm512_maskz_loadu_epi16(m, b) : _mm512_setzero_si512();
    lo = _mm512_permutex2var_epi16(x, _mm512_load_si512(kLo), y);
    hi = _mm512_permutex2var_epi16(x, _mm512_load_si512(kHi), y);
  }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I zero_words() { return _mm512_setzero_si512(); }
  static void store_words(uint32_t* p, I v) { _mm512_storeu_si512(p, v); }

  static void transpose(I r[L]) {
    I a[16], b[16];
    for (int k = 0; k < 8; ++k) {
      a[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
      a[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    // b[4k + j], 128-bit lane h: column 4h + j of rows 4k..4k+3.
    for (int k = 0; k < 4; ++k) {
      b[4 * k + 0] = _mm512_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
      b[4 * k + 1] = _mm512_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
      b[4 * k + 2] = _mm512_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
      b[4 * k + 3] = _mm512_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
    }
    for (int j = 0; j < 4; ++j) {
      I c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x44), c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xEE);
      I d0 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x44), d1 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xEE);
      r[j] = _mm512_shuffle_i32x4(c0, d0, 0x88);
      r[4 + j] = _mm512_shuffle_i32x4(c0, d0, 0xDD);
      r[8 + j] = _mm512_shuffle_i32x4(c1, d1, 0x88);
      r[12 + j] = _mm512_shuffle_i32x4(c1, d1, 0xDD);
    }
  }
};

}  // namespace moe::x86
