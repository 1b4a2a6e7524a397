// The portable element loops behind the row primitives, the casts and the
// gated activation: plain loops with one fixed order of operations and no fma
// (-ffp-contract=off), so they compute the same bits at any vector width.
// Included by the reference table (kernels/dispatch.cpp) and, inside each x86
// level's target region, by that level's table, where the compiler
// vectorizes them for the level. Internal linkage: one copy per level.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/activation.h"
#include "kernels/dispatch.h"
#include "moe/dtype.h"

namespace moe::kernels {
namespace {

inline float f32_of(float f) { return f; }
inline float f32_of(bf16 b) { return to_f32(b); }

template <class S>
void loop_axpy_f32(float w, const S* src, float* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] += w * f32_of(src[d]);
}
void loop_axpy_rounded(float w, const bf16* src, bf16* acc, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = to_bf16(to_f32(acc[d]) + w * to_f32(src[d]));
}
template <class T>
void loop_scale(float w, const T* src, T* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = store_as<T>(w * f32_of(src[d]));
}
// 16 lane sums (lane j takes the elements d = j mod 16, in order), the lanes
// added 0..15, then the tail in order.
template <class S>
float loop_dot(const S* a, const S* b, int64_t D) {
  float lane[16] = {};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int j = 0; j < 16; ++j) lane[j] += f32_of(a[d + j]) * f32_of(b[d + j]);
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s += lane[j];
  for (; d < D; ++d) s += f32_of(a[d]) * f32_of(b[d]);
  return s;
}
// dots[k] = loop_dot(dy, src[k]) and dst[k] = loop_scale(w[k], dy), k = 0..K-1.
template <class T>
void loop_dot_scale(const T* dy, const T* const* src, const float* w, T* const* dst, float* dots, int64_t K,
                    int64_t D, const T* const*, T* const*) {
  for (int64_t k = 0; k < K; ++k) {
    dots[k] = loop_dot(dy, src[k], D);
    loop_scale(w[k], dy, dst[k], D);
  }
}
void loop_f32_to_bf16(const float* s, bf16* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = to_bf16(s[i]);
}
void loop_bf16_to_f32(const bf16* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = to_f32(s[i]);
}
// dst = round_O(sum_k w[k] * src[k]): blocks of the row through an f32 buffer.
template <class S, class O>
void loop_weighted_sum(const float* w, const S* const* src, int64_t K, O* dst, int64_t D, const S* const*) {
  constexpr int64_t kBlock = 512;
  alignas(64) float acc[kBlock];
  for (int64_t d = 0; d < D; d += kBlock) {
    const int64_t n = std::min(kBlock, D - d);
    std::fill(acc, acc + n, 0.0f);
    for (int64_t k = 0; k < K; ++k) loop_axpy_f32(w[k], src[k] + d, acc, n);
    for (int64_t i = 0; i < n; ++i) dst[d + i] = store_as<O>(acc[i]);
  }
}
void loop_act_forward(Activation act, const float* g, const float* u, float* a, int64_t n) {
  if (act == Activation::silu) {
    for (int64_t i = 0; i < n; ++i) a[i] = silu(g[i]) * u[i];
  } else {
    for (int64_t i = 0; i < n; ++i) a[i] = gelu(g[i]) * u[i];
  }
}
void loop_act_backward(Activation act, const float* g, const float* u, const float* d, float* dg, float* du,
                       int64_t n) {
  if (act == Activation::silu) {
    for (int64_t i = 0; i < n; ++i) {
      const ActValueGrad v = silu_value_grad(g[i]);
      dg[i] = d[i] * u[i] * v.grad;
      du[i] = d[i] * v.value;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const ActValueGrad v = gelu_value_grad(g[i]);
      dg[i] = d[i] * u[i] * v.grad;
      du[i] = d[i] * v.value;
    }
  }
}
// bf16 rows: pieces widened into f32 buffers, the f32 loop, one rounding per output.
constexpr int64_t kActPiece = 256;
void loop_act_forward_b(Activation act, const bf16* g, const bf16* u, bf16* a, int64_t n) {
  alignas(64) float gf[kActPiece], uf[kActPiece], af[kActPiece];
  for (int64_t i = 0; i < n; i += kActPiece) {
    const int64_t m = std::min(kActPiece, n - i);
    loop_bf16_to_f32(g + i, gf, m);
    loop_bf16_to_f32(u + i, uf, m);
    loop_act_forward(act, gf, uf, af, m);
    loop_f32_to_bf16(af, a + i, m);
  }
}
void loop_act_backward_b(Activation act, const bf16* g, const bf16* u, const bf16* d, bf16* dg, bf16* du,
                         int64_t n) {
  alignas(64) float gf[kActPiece], uf[kActPiece], df[kActPiece], dgf[kActPiece], duf[kActPiece];
  for (int64_t i = 0; i < n; i += kActPiece) {
    const int64_t m = std::min(kActPiece, n - i);
    loop_bf16_to_f32(g + i, gf, m);
    loop_bf16_to_f32(u + i, uf, m);
    loop_bf16_to_f32(d + i, df, m);
    loop_act_backward(act, gf, uf, df, dgf, duf, m);
    loop_f32_to_bf16(dgf, dg + i, m);
    loop_f32_to_bf16(duf, du + i, m);
  }
}

// Element by element, in this order of operations (the bits of the scalar loop).
void loop_adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& k) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = k.b1 * m[i] + k.a1 * g[i];
    v[i] = k.b2 * v[i] + k.a2 * g[i] * g[i];
    const float update = (m[i] * k.c1) / (std::sqrt(v[i] * k.c2) + k.eps);
    p[i] -= k.lr * update + k.wd * p[i];
  }
}

// A table of the portable loops for `isa`, GEMM entries left to the caller.
Table portable_table(Isa isa) {
  Table t{};
  t.isa = isa;
  t.weighted_sum_bb = loop_weighted_sum<bf16, bf16>;
  t.weighted_sum_bf = loop_weighted_sum<bf16, float>;
  t.weighted_sum_ff = loop_weighted_sum<float, float>;
  t.axpy_f32_b = loop_axpy_f32<bf16>;
  t.axpy_f32_f = loop_axpy_f32<float>;
  t.axpy_rounded_b = loop_axpy_rounded;
  t.scale_b = loop_scale<bf16>;
  t.scale_f = loop_scale<float>;
  t.dot_b = loop_dot<bf16>;
  t.dot_f = loop_dot<float>;
  t.dot_scale_b = loop_dot_scale<bf16>;
  t.dot_scale_f = loop_dot_scale<float>;
  t.f32_to_bf16 = loop_f32_to_bf16;
  t.bf16_to_f32 = loop_bf16_to_f32;
  t.act_forward_f = loop_act_forward;
  t.act_forward_b = loop_act_forward_b;
  t.act_backward_f = loop_act_backward;
  t.act_backward_b = loop_act_backward_b;
  t.adamw = loop_adamw;
  return t;
}

}  // namespace
}  // namespace moe::kernels
