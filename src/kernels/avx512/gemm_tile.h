// AVX-512 building blocks of the grouped GEMM: one register-tile kernel and
// the packers that feed it. Included only by files compiled for AVX-512 (see
// the target pragma in grouped_gemm_avx512.cpp); everything here is internal.
//
// The unit of reduction is a "word" of 32 bits: a pair of bf16 (k, k+1), used
// by vdpbf16ps, or one f32, used by FMA. Every output element is ONE chain of
// word steps in increasing word order starting from +0: its bits depend only on
// its own row of A, its column of B and the word count, never on the tile
// shape, the row position or the thread (SPEC row independence).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe/dtype.h"

namespace moe::avx512 {

#define MOE_INLINE inline __attribute__((always_inline))
#define MOE_UNROLL _Pragma("GCC unroll 16")

// Step traits: how a word of A (broadcast) and a vector of 16 words of B
// combine into 16 f32 accumulators.
struct Bf16Step {
  static constexpr int kPerWord = 2;  // elements per 32-bit word
  MOE_INLINE static __m512 fma(__m512 acc, uint32_t a, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(int(a)), (__m512bh)b);
  }
};
struct F32Step {
  static constexpr int kPerWord = 1;
  MOE_INLINE static __m512 fma(__m512 acc, uint32_t a, __m512i b) {
    float f;
    std::memcpy(&f, &a, 4);
    return _mm512_fmadd_ps(_mm512_set1_ps(f), _mm512_castsi512_ps(b), acc);
  }
};

MOE_INLINE uint32_t load_word(const std::byte* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// A tile of MR rows x 16*NV columns. A word (row i, step p) lives at
// a + off[i] + p * a_step (bytes); B is packed [P][16*NV] words, 64-byte aligned.
// `half_last`: the last step's A word holds only its low bf16 (odd Kc), the
// high half reads as zero (B is zero there too, but A's bytes past the row
// may be another row or unmapped memory, so they are never loaded).
// The accumulators are locals in fully unrolled loops so they live in zmm
// registers (6x4 bf16: 24 accumulators + 4 B vectors of the 32).
template <class Step, int MR, int NV>
struct Tile {
  using Acc = __m512[MR][NV];

  MOE_INLINE static void step(Acc& acc, const std::byte* ap, const ptrdiff_t* off, const uint32_t* bp) {
    __m512i bv[NV];
    MOE_UNROLL for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_si512(bp + 16 * v);
    MOE_UNROLL for (int i = 0; i < MR; ++i) {
      uint32_t w = load_word(ap + off[i]);
      MOE_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = Step::fma(acc[i][v], w, bv[v]);
    }
  }

  MOE_INLINE static void step_half(Acc& acc, const std::byte* ap, const ptrdiff_t* off, const uint32_t* bp) {
    __m512i bv[NV];
    MOE_UNROLL for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_si512(bp + 16 * v);
    MOE_UNROLL for (int i = 0; i < MR; ++i) {
      uint16_t lo;
      std::memcpy(&lo, ap + off[i], 2);
      MOE_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = Step::fma(acc[i][v], uint32_t(lo), bv[v]);
    }
  }

  // out[i, c] = sum_p A[i, p] * B[p, c] for rows [0, mr) and columns [0, nc)
  // (row stride ldc elements). Napkin: per step NV loads + MR broadcasts for
  // MR*NV FMAs (6x4: 10 loads per 24 dp, ~12 cycles at 2 dp/cycle).
  template <class Out>
  static void run(const std::byte* a, const ptrdiff_t* row_off, ptrdiff_t a_step, const uint32_t* b, int64_t P,
                  bool half_last, Out* out, int64_t ldc, int mr, int64_t nc, bool stream = false,
                  bool accumulate = false) {
    ptrdiff_t off[MR];
    MOE_UNROLL for (int i = 0; i < MR; ++i) off[i] = row_off[i];
    Acc acc;
    MOE_UNROLL for (int i = 0; i < MR; ++i)
      MOE_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
    if constexpr (sizeof(Out) == 4) {
      // Continue the chains of an earlier call over the preceding words (f32
      // out): the f32 partial sums reload exactly, so blocking the reduction
      // this way gives the same bits as one call over all the words.
      if (accumulate)
        MOE_UNROLL for (int i = 0; i < MR; ++i)
          MOE_UNROLL for (int v = 0; v < NV; ++v) {
            int64_t left = nc - 16 * v;
            if (i >= mr || left <= 0) continue;
            acc[i][v] = _mm512_maskz_loadu_ps(left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1),
                                              out + i * ldc + 16 * v);
          }
    }
    int64_t full = half_last ? P - 1 : P;
    for (int64_t p = 0; p < full; ++p) step(acc, a + p * a_step, off, b + p * 16 * NV);
    if (half_last) step_half(acc, a + full * a_step, off, b + full * 16 * NV);
    store(acc, out, ldc, mr, nc, stream);
  }

  template <class Out>
  MOE_INLINE static void store(const Acc& acc, Out* out, int64_t ldc, int mr, int64_t nc, bool stream) {
    if constexpr (sizeof(Out) == 4) {
      // Non-temporal stores (no read for ownership) for outputs written once and not read
      // soon, such as weight gradients: full tiles on 64-byte aligned rows only.
      if (stream && mr == MR && nc == 16 * NV && ((uintptr_t(out) | uintptr_t(ldc * 4)) & 63) == 0) {
        MOE_UNROLL for (int i = 0; i < MR; ++i)
          MOE_UNROLL for (int v = 0; v < NV; ++v) _mm512_stream_ps(out + i * ldc + 16 * v, acc[i][v]);
        return;
      }
    }
    if (mr == MR && nc == 16 * NV) {
      MOE_UNROLL for (int i = 0; i < MR; ++i)
        MOE_UNROLL for (int v = 0; v < NV; ++v) store16(out + i * ldc + 16 * v, __mmask16(0xffff), acc[i][v]);
      return;
    }
    MOE_UNROLL for (int i = 0; i < MR; ++i)
      MOE_UNROLL for (int v = 0; v < NV; ++v) {
        int64_t left = nc - 16 * v;
        if (i >= mr || left <= 0) continue;
        __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
        store16(out + i * ldc + 16 * v, m, acc[i][v]);
      }
  }

  MOE_INLINE static void store16(float* p, __mmask16 m, __m512 x) { _mm512_mask_storeu_ps(p, m, x); }
  MOE_INLINE static void store16(bf16* p, __mmask16 m, __m512 x) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(x));
  }
};

// Byte mask for the first n (clamped to 0..64) bytes of a 64-byte vector.
inline __mmask64 first_bytes(int64_t n) {
  if (n >= 64) return ~__mmask64(0);
  if (n <= 0) return 0;
  return (__mmask64(1) << n) - 1;
}

// Packers write dst[p * ldd + j] for j in [0, W) (W a multiple of 16; columns
// j >= nc and missing rows are zero).

// dst[p][j] = elements (2p, 2p+1) of column c0 + j, counting rows from r0,
// in rows [r0, r1) of src (bf16, row stride ld): interleaves row pairs. For
// f32 (one element per word) it is a plain panel copy.
template <class T>
void pack_row_pairs(const T* src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t nc, uint32_t* dst,
                    int64_t ldd, int64_t W);

// dst[p][j] = word p of row c0 + j of src (row stride ld elements; rows hold
// `len` elements, so the last word of an odd bf16 row is half, its high half
// zero): 16x16 word transposes, reading B^T in place.
template <class T>
void pack_transposed(const T* src, int64_t ld, int64_t len, int64_t c0, int64_t nc, uint32_t* dst, int64_t ldd,
                     int64_t W);

// Words per row of a packed operand: ceil(n / elements per word).
template <class T>
constexpr int64_t words_of(int64_t n) {
  return (n * int64_t(sizeof(T)) + 3) / 4;
}

}  // namespace moe::avx512
