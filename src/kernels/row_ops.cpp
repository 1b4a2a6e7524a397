// The row primitives: the active level's kernels (kernels/dispatch.h). Every
// level computes the same bits (kernels/row_loops.h, simd/rows_impl.h).
#include "kernels/row_ops.h"

#include "kernels/dispatch.h"

namespace moe::rows {

void weighted_sum(const float* w, const bf16* const* src, int64_t K, bf16* dst, int64_t D, const bf16* const* next) {
  kernels::table().weighted_sum_bb(w, src, K, dst, D, next);
}
void weighted_sum(const float* w, const bf16* const* src, int64_t K, float* dst, int64_t D, const bf16* const* next) {
  kernels::table().weighted_sum_bf(w, src, K, dst, D, next);
}
void weighted_sum(const float* w, const float* const* src, int64_t K, float* dst, int64_t D, const float* const* next) {
  kernels::table().weighted_sum_ff(w, src, K, dst, D, next);
}

void axpy_f32(float w, const bf16* src, float* acc, int64_t D) { kernels::table().axpy_f32_b(w, src, acc, D); }
void axpy_f32(float w, const float* src, float* acc, int64_t D) { kernels::table().axpy_f32_f(w, src, acc, D); }
void axpy_rounded(float w, const bf16* src, bf16* acc, int64_t D) { kernels::table().axpy_rounded_b(w, src, acc, D); }
void axpy_rounded(float w, const float* src, float* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] + w * src[d];
}
void scale(float w, const bf16* src, bf16* dst, int64_t D) { kernels::table().scale_b(w, src, dst, D); }
void scale(float w, const float* src, float* dst, int64_t D) { kernels::table().scale_f(w, src, dst, D); }
float dot(const bf16* a, const bf16* b, int64_t D) { return kernels::table().dot_b(a, b, D); }
float dot(const float* a, const float* b, int64_t D) { return kernels::table().dot_f(a, b, D); }
void dot_scale(const bf16* dy, const bf16* const* src, const float* w, bf16* const* dst, float* dots,
               int64_t K, int64_t D, const bf16* const* next_src, bf16* const* next_dst) {
  kernels::table().dot_scale_b(dy, src, w, dst, dots, K, D, next_src, next_dst);
}
void dot_scale(const float* dy, const float* const* src, const float* w, float* const* dst, float* dots,
               int64_t K, int64_t D, const float* const* next_src, float* const* next_dst) {
  kernels::table().dot_scale_f(dy, src, w, dst, dots, K, D, next_src, next_dst);
}
void store_row(const float* acc, bf16* dst, int64_t D) { kernels::table().f32_to_bf16(acc, dst, D); }
void store_row(const float* acc, float* dst, int64_t D) { std::memcpy(dst, acc, size_t(D) * sizeof(float)); }

void weighted_sum(const double* w, const double* const* src, int64_t K, double* dst, int64_t D,
                  const double* const*) {
  for (int64_t d = 0; d < D; ++d) {
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k) acc += w[k] * src[k][d];
    dst[d] = acc;
  }
}
void axpy_rounded(double w, const double* src, double* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] + w * src[d];
}
void scale(double w, const double* src, double* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = w * src[d];
}
double dot(const double* a, const double* b, int64_t D) {
  double s = 0.0;
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace moe::rows
