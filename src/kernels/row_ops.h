// Row primitives shared by the reference and fused permute/combine kernels,
// so both add in the same order and give the same bits (SPEC.md §4).
#pragma once

#include <cstdint>
#include <cstring>

#include "moe/dtype.h"

namespace moe::rows {

template <class T>
inline void copy(const T* src, T* dst, int64_t D) {
  std::memcpy(dst, src, size_t(D) * sizeof(T));
}

// acc[d] += w * src[d] in f32.
template <class T>
inline void axpy_f32(float w, const T* src, float* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] += w * load_f32(src[d]);
}

// acc[d] = round_T(acc[d] + w * src[d]): accumulation in the activation type.
template <class T>
inline void axpy_rounded(float w, const T* src, T* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = store_as<T>(load_f32(acc[d]) + w * load_f32(src[d]));
}

// dst[d] = round_T(w * src[d]).
template <class T>
inline void scale(float w, const T* src, T* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = store_as<T>(w * load_f32(src[d]));
}

// <a, b> in f32, sequential over d.
template <class T>
inline float dot(const T* a, const T* b, int64_t D) {
  float s = 0.0f;
  for (int64_t d = 0; d < D; ++d) s += load_f32(a[d]) * load_f32(b[d]);
  return s;
}

template <class T>
inline void store_row(const float* acc, T* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = store_as<T>(acc[d]);
}

}  // namespace moe::rows
