// Row kernels of every SIMD level (x86 and Arm) over the vector traits V: the weighted row
// sum of the combine and the permute's backward, and the f32 <-> bf16 row
// casts. Same bits as the portable loops (kernels/row_loops.h): per element,
// acc = 0, then acc = acc + w[k] * src[k][d] for k = 0..K-1 (a rounded
// product, then a rounded add: no fma), then one RNE rounding to the output
// type. The gain over the loops is that the sum stays in registers: one read
// of each source row and one write of the output. Included inside a level's
// target region (kernels_<level>.cpp); internal linkage.
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe::simd {
namespace {

template <class V>
typename V::F load_row(const float* p, int64_t n) {
  return n >= V::L ? V::load(p) : V::load_n(p, n);
}
template <class V>
typename V::F load_row(const bf16* p, int64_t n) {
  return n >= V::L ? V::load_bf16(p) : V::load_bf16_n(p, n);
}
template <class V>
void store_row(float* p, typename V::F v, int64_t n) {
  n >= V::L ? V::store(p, v) : V::store_n(p, v, n);
}
template <class V>
void store_row(bf16* p, typename V::F v, int64_t n) {
  n >= V::L ? V::store_bf16(p, v) : V::store_bf16_n(p, v, n);
}

// `next` (optional, K rows): the rows of the following call, prefetched as this one runs.
template <class V, class S, class O>
void weighted_sum(const float* w, const S* const* src, int64_t K, O* dst, int64_t D, const S* const* next) {
  using F = typename V::F;
  constexpr int kB = 64 / V::L;  // 64 elements per step: independent add chains
  int64_t d = 0;
  for (; d + 64 <= D; d += 64) {
    F acc[kB];
    for (int b = 0; b < kB; ++b) acc[b] = V::zero();
    for (int64_t k = 0; k < K; ++k) {
      const F wk = V::set1(w[k]);
      const S* s = src[k] + d;
      for (int b = 0; b < kB; ++b) acc[b] = V::add(acc[b], V::mul(wk, load_row<V>(s + V::L * b, V::L)));
      if (next) {
        const char* p = reinterpret_cast<const char*>(next[k] + d);
        for (int64_t off = 0; off < int64_t(64 * sizeof(S)); off += 64) __builtin_prefetch(p + off, 0, 3);
      }
    }
    for (int b = 0; b < kB; ++b) store_row<V>(dst + d + V::L * b, acc[b], V::L);
  }
  for (; d < D; d += V::L) {
    const int64_t n = D - d;
    F acc = V::zero();
    for (int64_t k = 0; k < K; ++k) acc = V::add(acc, V::mul(V::set1(w[k]), load_row<V>(src[k] + d, n)));
    store_row<V>(dst + d, acc, n);
  }
}

// dot's end: its 16 lane sums (in 16 / L vectors) added 0..15, then the tail [d, D) in order.
template <class V, class S>
float dot_finish(const typename V::F* acc, const S* a, const S* b, int64_t d, int64_t D) {
  alignas(64) float lane[16];
  for (int v = 0; v < 16 / V::L; ++v) V::store(lane + V::L * v, acc[v]);
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s += lane[j];
  for (; d < D; ++d) s += load_f32(a[d]) * load_f32(b[d]);
  return s;
}

// dot: 16 lane sums (lane j takes the elements d = j mod 16, in order), the lanes added 0..15, then
// the tail in order: loop_dot's bits, the lanes held in 16 / L vectors.
template <class V, class S>
float dot(const S* a, const S* b, int64_t D) {
  static_assert(16 % V::L == 0, "dot: the 16 lanes are whole vectors");
  constexpr int kV = 16 / V::L;
  typename V::F acc[kV];
  for (int v = 0; v < kV; ++v) acc[v] = V::zero();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int v = 0; v < kV; ++v)
      acc[v] =
          V::add(acc[v], V::mul(load_row<V>(a + d + V::L * v, V::L), load_row<V>(b + d + V::L * v, V::L)));
  return dot_finish<V>(acc, a, b, d, D);
}
// The combine's backward for one token: dots[k] = dot(dy, src[k]) and dst[k] = scale(w[k], dy), the
// bits of those two, for kR rows at a time in one pass over dy: dy is read once per group of rows and
// the rows' dot chains (each a dependent add per 16 elements) run side by side. `next_src` /
// `next_dst` (optional, K rows each): the next token's rows, a line of each per 64 bytes of this
// one's, prefetched to read and to write.
template <class V, class T>
void dot_scale(const T* dy, const T* const* src, const float* w, T* const* dst, float* dots, int64_t K,
               int64_t D, const T* const* next_src, T* const* next_dst) {
  using F = typename V::F;
  constexpr int kV = 16 / V::L;  // vectors of dot's 16 lanes
  constexpr int kR = 8 / kV;     // rows at a time: 8 accumulators
  for (int64_t k0 = 0; k0 < K; k0 += kR) {
    const int nr = int(std::min<int64_t>(kR, K - k0));
    F acc[kR][kV], wv[kR];
    for (int r = 0; r < nr; ++r) {
      wv[r] = V::set1(w[k0 + r]);
      for (int v = 0; v < kV; ++v) acc[r][v] = V::zero();
    }
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
      if (next_src && (d * int64_t(sizeof(T))) % 64 == 0)
        for (int r = 0; r < nr; ++r) {
          __builtin_prefetch(next_src[k0 + r] + d, 0, 3);
          __builtin_prefetch(next_dst[k0 + r] + d, 1, 3);
        }
      for (int v = 0; v < kV; ++v) {
        const F x = load_row<V>(dy + d + V::L * v, V::L);
        for (int r = 0; r < nr; ++r) {
          acc[r][v] = V::add(acc[r][v], V::mul(x, load_row<V>(src[k0 + r] + d + V::L * v, V::L)));
          store_row<V>(dst[k0 + r] + d + V::L * v, V::mul(wv[r], x), V::L);
        }
      }
    }
    for (int64_t e = d; e < D; e += V::L) {  // the scale's tail (masked)
      const F x = load_row<V>(dy + e, D - e);
      for (int r = 0; r < nr; ++r) store_row<V>(dst[k0 + r] + e, V::mul(wv[r], x), D - e);
    }
    for (int r = 0; r < nr; ++r) dots[k0 + r] = dot_finish<V>(acc[r], dy, src[k0 + r], d, D);
  }
}

// dst = round_T(w * src), element by element.
template <class V, class T>
void scale(float w, const T* src, T* dst, int64_t D) {
  const typename V::F wv = V::set1(w);
  for (int64_t d = 0; d < D; d += V::L) store_row<V>(dst + d, V::mul(wv, load_row<V>(src + d, D - d)), D - d);
}

template <class V>
void cast_f32_to_bf16(const float* s, bf16* d, int64_t n) {
  for (int64_t i = 0; i < n; i += V::L) store_row<V>(d + i, load_row<V>(s + i, n - i), n - i);
}
template <class V>
void cast_bf16_to_f32(const bf16* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; i += V::L) store_row<V>(d + i, load_row<V>(s + i, n - i), n - i);
}

// The level's table: the portable loops compiled for the level, the vector row
// kernels and casts, and the grouped GEMM of level Lv (gemm_impl.h).
template <class Lv>
kernels::Table level_table(Isa isa) {
  using V = typename Lv::V;
  kernels::Table t = kernels::portable_table(isa);
  t.gmm = Gemm<Lv>::gmm;
  t.gmm_dlhs = Gemm<Lv>::dlhs;
  t.gmm_drhs = Gemm<Lv>::drhs;
  t.gmm_drhs_acc = Gemm<Lv>::drhs_acc;
  t.gmm_pair = Gemm<Lv>::gmm_pair;
  t.gmm_dlhs_add = Gemm<Lv>::dlhs_add;
  t.weighted_sum_bb = weighted_sum<V, bf16, bf16>;
  t.weighted_sum_bf = weighted_sum<V, bf16, float>;
  t.weighted_sum_ff = weighted_sum<V, float, float>;
  t.dot_b = dot<V, bf16>;
  t.dot_f = dot<V, float>;
  t.scale_b = scale<V, bf16>;
  t.scale_f = scale<V, float>;
  t.dot_scale_b = dot_scale<V, bf16>;
  t.dot_scale_f = dot_scale<V, float>;
  t.f32_to_bf16 = cast_f32_to_bf16<V>;
  t.bf16_to_f32 = cast_bf16_to_f32<V>;
  return t;
}

}  // namespace
}  // namespace moe::simd
