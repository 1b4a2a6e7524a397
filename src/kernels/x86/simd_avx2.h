// Vector traits of the AVX2 level: 8 f32 lanes in a ymm register, 16
// registers. The kernels (simd/gemm_impl.h, simd/rows_impl.h) are written once over
// these traits (simd_avx512.h has the same members). Include only inside the
// AVX2 target region (target_avx2.h).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe/dtype.h"

namespace moe::x86 {

struct Avx2 {
  static constexpr int L = 8;  // f32 lanes per vector
  using F = __m256;
  using I = __m256i;

  static I lanes_below(int64_t n) {  // lane j all-ones iff j < n
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n < 0 ? 0 : n > L ? L : n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float f) { return _mm256_set1_ps(f); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c, one rounding
  // The activation's lane operations (simd/act_impl.h).
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static F max_else(F a, F b) { return _mm256_max_ps(a, b); }  // a > b ? a : b (b if either is NaN)
  static F min_else(F a, F b) { return _mm256_min_ps(a, b); }  // a < b ? a : b (b if either is NaN)
  // 0.5 with t's sign bit (-0.5 for -0 and a negative NaN): (t & sign) | 0.5.
  static F half_with_sign(F t) {
    return _mm256_or_ps(_mm256_and_ps(t, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(0.5f));
  }
  static I trunc_i32(F a) { return _mm256_cvttps_epi32(a); }  // NaN, out of range: INT32_MIN
  static F to_f(I a) { return _mm256_cvtepi32_ps(a); }
  static F pow2(I n) {  // the bits (n + 127) << 23
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  }

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load_n(const float* p, int64_t n) {
    return n >= L ? load(p) : _mm256_maskload_ps(p, lanes_below(n));
  }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, F v, int64_t n) {
    if (n >= L) return store(p, v);
    _mm256_maskstore_ps(p, lanes_below(n), v);
  }
  static void stream(float* p, F v) { _mm256_stream_ps(p, v); }
  static void fence() { _mm_sfence(); }  // orders the streamed stores before later stores
  static constexpr int kStreamAlign = 32;

  // bf16 rows: widened exactly to f32; rounded to nearest even exactly as moe::to_bf16.
  static F load_bf16(const bf16* p) {
    I w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static F load_bf16_n(const bf16* p, int64_t n) {
    if (n >= L) return load_bf16(p);
    alignas(32) uint16_t tmp[L] = {};
    if (n > 0) std::memcpy(tmp, p, size_t(n) * 2);
    return load_bf16(reinterpret_cast<const bf16*>(tmp));
  }
  static __m128i round_bf16(F v) {
    const I u = _mm256_castps_si256(v);
    const I hi = _mm256_srli_epi32(u, 16);
    const I lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const I rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const I abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const I nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const I out = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // 8 x 32-bit (each < 2^16) -> 8 x 16-bit, in order.
    const I packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0x08);
    return _mm256_castsi256_si128(packed);
  }
  static void store_bf16(bf16* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), round_bf16(v)); }
  static void store_bf16_n(bf16* p, F v, int64_t n) {
    if (n >= L) return store_bf16(p, v);
    alignas(16) uint16_t tmp[L];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), round_bf16(v));
    if (n > 0) std::memcpy(p, tmp, size_t(n) * 2);
  }

  // A 32-bit word in every lane, and the two bf16 halves of such words widened to f32.
  static F bcast_word(uint32_t w) { return _mm256_castsi256_ps(_mm256_set1_epi32(int(w))); }
  static F low_bf16(F w) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(w), 16)); }
  static F high_bf16(F w) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(w), _mm256_set1_epi32(int(0xffff0000u))));
  }

  // Packing: L 32-bit words.
  static I words(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static I words_n(const void* p, int64_t nbytes) {  // the first nbytes bytes, the rest zero
    if (nbytes >= 4 * L) return words(p);
    alignas(32) uint8_t tmp[4 * L] = {};
    if (nbytes > 0) std::memcpy(tmp, p, size_t(nbytes));
    return words(tmp);
  }
  static I u16_n(const uint16_t* p, int64_t n) {  // lane j = p[j] zero-extended, j < n; else 0
    if (n >= L) return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    alignas(16) uint16_t tmp[L] = {};
    if (n > 0) std::memcpy(tmp, p, size_t(n) * 2);
    return _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
  }
  static I shl16(I v) { return _mm256_slli_epi32(v, 16); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I zero_words() { return _mm256_setzero_si256(); }
  static void store_words(uint32_t* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

  // In-register transpose of L rows of L words: r[c] becomes column c.
  static void transpose(I r[L]) {
    I a[8], b[8];
    for (int k = 0; k < 4; ++k) {
      a[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
      a[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    // b[4k + j], 128-bit lane h: column 4h + j of rows 4k..4k+3.
    for (int k = 0; k < 2; ++k) {
      b[4 * k + 0] = _mm256_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
      b[4 * k + 1] = _mm256_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
      b[4 * k + 2] = _mm256_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
      b[4 * k + 3] = _mm256_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
    }
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm256_permute2x128_si256(b[j], b[4 + j], 0x20);
      r[4 + j] = _mm256_permute2x128_si256(b[j], b[4 + j], 0x31);
    }
  }
};

}  // namespace moe::x86
