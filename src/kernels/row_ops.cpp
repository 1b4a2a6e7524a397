#include "kernels/row_ops.h"

#include <algorithm>

#include "core/target_clones.h"
#include "kernels/avx512/row_ops_avx512.h"
#include "kernels/grouped_gemm_internal.h"

namespace moe {
namespace rows {
namespace {

#define MOE_ROW_CLONES MOE_TARGET_CLONES

inline float f32_of(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float f32_of(float f) { return f; }

inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

template <class S>
inline float dot_lanes(const S* a, const S* b, int64_t D) {
  float lane[16] = {};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int j = 0; j < 16; ++j) lane[j] += f32_of(a[d + j]) * f32_of(b[d + j]);
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s += lane[j];
  for (; d < D; ++d) s += f32_of(a[d]) * f32_of(b[d]);
  return s;
}

const uint16_t* bits(const bf16* p) { return reinterpret_cast<const uint16_t*>(p); }
uint16_t* bits(bf16* p) { return reinterpret_cast<uint16_t*>(p); }

MOE_ROW_CLONES void axpy_bf16(float w, const uint16_t* src, float* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] += w * f32_of(src[d]);
}
MOE_ROW_CLONES void axpy_f32_impl(float w, const float* src, float* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] += w * src[d];
}
MOE_ROW_CLONES void axpy_rounded_bf16(float w, const uint16_t* src, uint16_t* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = bf16_bits(f32_of(acc[d]) + w * f32_of(src[d]));
}
MOE_ROW_CLONES void scale_bf16(float w, const uint16_t* src, uint16_t* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = bf16_bits(w * f32_of(src[d]));
}
MOE_ROW_CLONES void scale_f32(float w, const float* src, float* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = w * src[d];
}
MOE_ROW_CLONES float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t D) { return dot_lanes(a, b, D); }
MOE_ROW_CLONES float dot_f32(const float* a, const float* b, int64_t D) { return dot_lanes(a, b, D); }
MOE_ROW_CLONES void store_bf16(const float* acc, uint16_t* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = bf16_bits(acc[d]);
}

// The portable weighted_sum: blocks of the row through an f32 buffer.
template <class S, class O>
void weighted_sum_portable(const float* w, const S* const* src, int64_t K, O* dst, int64_t D) {
  constexpr int64_t kBlock = 512;
  alignas(64) float acc[kBlock];
  for (int64_t d = 0; d < D; d += kBlock) {
    const int64_t n = std::min(kBlock, D - d);
    std::fill(acc, acc + n, 0.0f);
    for (int64_t k = 0; k < K; ++k) axpy_f32(w[k], src[k] + d, acc, n);
    store_row(acc, dst + d, n);
  }
}

bool use_avx512() {
  static const bool yes = avx512::supports(DType::f32);
  return yes;
}

template <class S, class O>
void weighted_sum_any(const float* w, const S* const* src, int64_t K, O* dst, int64_t D, const S* const* next) {
  if (use_avx512()) return avx512::weighted_sum(w, src, K, dst, D, next);
  weighted_sum_portable(w, src, K, dst, D);
}

}  // namespace

void weighted_sum(const float* w, const bf16* const* src, int64_t K, bf16* dst, int64_t D, const bf16* const* next) {
  weighted_sum_any(w, src, K, dst, D, next);
}
void weighted_sum(const float* w, const bf16* const* src, int64_t K, float* dst, int64_t D, const bf16* const* next) {
  weighted_sum_any(w, src, K, dst, D, next);
}
void weighted_sum(const float* w, const float* const* src, int64_t K, float* dst, int64_t D, const float* const* next) {
  weighted_sum_any(w, src, K, dst, D, next);
}

void axpy_f32(float w, const bf16* src, float* acc, int64_t D) { axpy_bf16(w, bits(src), acc, D); }
void axpy_f32(float w, const float* src, float* acc, int64_t D) { axpy_f32_impl(w, src, acc, D); }
void axpy_rounded(float w, const bf16* src, bf16* acc, int64_t D) { axpy_rounded_bf16(w, bits(src), bits(acc), D); }
void axpy_rounded(float w, const float* src, float* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] + w * src[d];
}
void scale(float w, const bf16* src, bf16* dst, int64_t D) { scale_bf16(w, bits(src), bits(dst), D); }
void scale(float w, const float* src, float* dst, int64_t D) { scale_f32(w, src, dst, D); }
float dot(const bf16* a, const bf16* b, int64_t D) { return dot_bf16(bits(a), bits(b), D); }
float dot(const float* a, const float* b, int64_t D) { return dot_f32(a, b, D); }
void store_row(const float* acc, bf16* dst, int64_t D) { store_bf16(acc, bits(dst), D); }
void store_row(const float* acc, float* dst, int64_t D) { std::memcpy(dst, acc, size_t(D) * sizeof(float)); }

}  // namespace rows
}  // namespace moe
