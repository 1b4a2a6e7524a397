// Row primitives shared by the reference and fused permute/combine kernels
// (and the ring of experts), so every path adds in the same order and gives
// the same bits (SPEC.md §4). Each runs the active kernel level's version
// (kernels/dispatch.h); every level computes the same bits: there is no fma
// contraction (-ffp-contract=off) and every sum has an explicit order.
#pragma once

#include <cstdint>
#include <cstring>

#include "moe/dtype.h"

namespace moe::rows {

// Grain (items per task) of a parallel loop over rows that moves
// `bytes_per_item` bytes per item: at least `min_items`, and enough items
// that a task moves >= 32 KiB, so small calls run on the calling thread
// instead of paying a hand-off to the pool (microseconds) for nanoseconds of work.
inline int64_t row_grain(int64_t bytes_per_item, int64_t min_items) {
  constexpr int64_t kMinTaskBytes = 32 << 10;
  const int64_t by_bytes = (kMinTaskBytes + bytes_per_item - 1) / (bytes_per_item > 0 ? bytes_per_item : 1);
  return by_bytes > min_items ? by_bytes : min_items;
}

template <class T>
inline void copy(const T* src, T* dst, int64_t D) {
  std::memcpy(dst, src, size_t(D) * sizeof(T));
}

// acc[d] += w * src[d] in f32.
void axpy_f32(float w, const bf16* src, float* acc, int64_t D);
void axpy_f32(float w, const float* src, float* acc, int64_t D);

// acc[d] = round_T(acc[d] + w * src[d]): accumulation in the activation type.
void axpy_rounded(float w, const bf16* src, bf16* acc, int64_t D);
void axpy_rounded(float w, const float* src, float* acc, int64_t D);

// dst[d] = round_T(w * src[d]).
void scale(float w, const bf16* src, bf16* dst, int64_t D);
void scale(float w, const float* src, float* dst, int64_t D);

// <a, b> in f32: 16 lane sums (lane j takes elements d = j mod 16, in order),
// then the lanes added 0..15, then the tail in order. A fixed order, so the
// value is the same wherever it is computed.
float dot(const bf16* a, const bf16* b, int64_t D);
float dot(const float* a, const float* b, int64_t D);

// The combine's backward for one token: dots[k] = dot(dy, src[k]) and dst[k] = scale(w[k], dy) for
// k = 0..K-1, the bits of those calls, in one pass over dy. `next_src` / `next_dst` (optional, K rows
// each, both or neither): the next call's rows, prefetched (to read / to write) as this one runs.
void dot_scale(const bf16* dy, const bf16* const* src, const float* w, bf16* const* dst, float* dots,
               int64_t K, int64_t D, const bf16* const* next_src = nullptr, bf16* const* next_dst = nullptr);
void dot_scale(const float* dy, const float* const* src, const float* w, float* const* dst, float* dots,
               int64_t K, int64_t D, const float* const* next_src = nullptr,
               float* const* next_dst = nullptr);

// dst[d] = round_O(sum_k w[k] * src[k][d]): the sum in f32 from 0, k = 0..K-1
// in order, each term a rounded product (the bits of filling an f32 row with
// 0, axpy_f32 of each source, store_row). At the x86 levels one pass with the
// sum in registers, at reference a portable loop: same bits. `next`
// (optional, K rows): the rows of the following call, prefetched as this one runs.
void weighted_sum(const float* w, const bf16* const* src, int64_t K, bf16* dst, int64_t D,
                  const bf16* const* next = nullptr);
void weighted_sum(const float* w, const bf16* const* src, int64_t K, float* dst, int64_t D,
                  const bf16* const* next = nullptr);
void weighted_sum(const float* w, const float* const* src, int64_t K, float* dst, int64_t D,
                  const float* const* next = nullptr);

// f64 rows (the reference-only double path, never in a level's table): the
// same operations as plain loops in f64, each sum in index order from 0.
void weighted_sum(const double* w, const double* const* src, int64_t K, double* dst, int64_t D,
                  const double* const* next = nullptr);
void axpy_rounded(double w, const double* src, double* acc, int64_t D);
void scale(double w, const double* src, double* dst, int64_t D);
double dot(const double* a, const double* b, int64_t D);

// dst[d] = round_T(acc[d]).
void store_row(const float* acc, bf16* dst, int64_t D);
void store_row(const float* acc, float* dst, int64_t D);

}  // namespace moe::rows
