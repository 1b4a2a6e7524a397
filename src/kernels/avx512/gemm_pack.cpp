// Operand packers for the AVX-512 grouped GEMM (declared in gemm_tile.h).
// Napkin: a packer moves each element once with ~0.3 vector ops per word; the
// tiles that consume a packed panel do >= 2*MR*... flops per word, so packing
// stays a few percent of the GEMM as long as a panel is reused by >= ~64 rows.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "moe/dtype.h"

#include "kernels/avx512/target_begin.h"

#include "kernels/avx512/gemm_tile.h"

namespace moe::avx512 {
namespace {

__mmask16 first16(int64_t n) {
  if (n >= 16) return __mmask16(0xffff);
  return n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// 16 words: column block [j, j+16) of rows a and b (b may be null), interleaved.
__m512i pair_words(const bf16* a, const bf16* b, __mmask16 m) {
  __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a));
  if (!b) return lo;
  __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}
__m512i pair_words(const float* a, const float*, __mmask16 m) {
  return _mm512_castps_si512(_mm512_maskz_loadu_ps(m, a));
}

// In-register transpose of 16 rows of 16 words: r[c] becomes column c.
void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  // b[4k + j], 128-bit lane L: column 4L + j of rows 4k..4k+3.
  for (int k = 0; k < 4; ++k) {
    b[4 * k + 0] = _mm512_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 1] = _mm512_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 2] = _mm512_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
    b[4 * k + 3] = _mm512_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x44), c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xEE);
    __m512i d0 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x44);
    __m512i d1 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xEE);
    r[j] = _mm512_shuffle_i32x4(c0, d0, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(c0, d0, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(c1, d1, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(c1, d1, 0xDD);
  }
}

// Rows this far ahead (in words) are prefetched: weight panels of many
// experts come from DRAM, and a packer waiting on one row at a time runs at
// latency speed (~1/3 of the grouped GEMM time before this).
constexpr int64_t kAhead = 8;

template <class T>
void prefetch_rows(const T* src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t nc) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* p = reinterpret_cast<const char*>(src + r * ld + c0);
    for (int64_t off = 0; off < nc * int64_t(sizeof(T)); off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  }
}

}  // namespace

template <class T>
void pack_row_pairs(const T* src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t nc, uint32_t* dst,
                    int64_t ldd, int64_t W) {
  constexpr int64_t per = 4 / int64_t(sizeof(T));
  int64_t P = words_of<T>(r1 - r0);
  for (int64_t p = 0; p < P; ++p) {
    const T* a = src + (r0 + per * p) * ld + c0;
    const T* b = (per == 2 && r0 + 2 * p + 1 < r1) ? a + ld : nullptr;
    prefetch_rows(src, ld, r0 + per * (p + kAhead), std::min(r1, r0 + per * (p + kAhead + 1)), c0, nc);
    for (int64_t j = 0; j < W; j += 16) {
      __mmask16 m = first16(nc - j);
      __m512i w = m ? pair_words(a + j, b ? b + j : nullptr, m) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + p * ldd + j, w);
    }
  }
}

template <class T>
void pack_transposed(const T* src, int64_t ld, int64_t len, int64_t c0, int64_t nc, uint32_t* dst, int64_t ldd,
                     int64_t W) {
  int64_t P = words_of<T>(len), row_bytes = len * int64_t(sizeof(T));
  for (int64_t j = 0; j < W; j += 16) {
    for (int64_t p = 0; p < P; p += 16) {
      __m512i r[16];
      __mmask64 m = first_bytes(row_bytes - 4 * p);
      for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_setzero_si512();
        if (j + i >= nc) continue;
        r[i] = _mm512_maskz_loadu_epi8(m, reinterpret_cast<const std::byte*>(src + (c0 + j + i) * ld) + 4 * p);
      }
      transpose16(r);
      for (int64_t c = 0; c < std::min<int64_t>(16, P - p); ++c) _mm512_storeu_si512(dst + (p + c) * ldd + j, r[c]);
    }
  }
}

template void pack_row_pairs<bf16>(const bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t*, int64_t,
                                   int64_t);
template void pack_row_pairs<float>(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t*, int64_t,
                                    int64_t);
template void pack_transposed<bf16>(const bf16*, int64_t, int64_t, int64_t, int64_t, uint32_t*, int64_t, int64_t);
template void pack_transposed<float>(const float*, int64_t, int64_t, int64_t, int64_t, uint32_t*, int64_t, int64_t);

}  // namespace moe::avx512

#include "kernels/avx512/target_end.h"
