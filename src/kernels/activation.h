// Gated activation of the expert FFN (SPEC.md §2 step 5): a = act(h0) * h1,
// computed in f32 from the stored h values and rounded once to the output
// type. The scalar functions are inline so a fused GEMM epilogue computes the
// same bits as these kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "moe/config.h"
#include "moe/tensor.h"

namespace moe {

// Each activation's value and derivative from one transcendental (the
// backward needs both; one exp / tanh per element instead of two).
struct ActValueGrad {
  float value, grad;
};

// The clamp of exp_approx's argument: the range of a normal f32 result with the scale 2^n at most
// 2^127, so exp_approx saturates at a finite 2.4e38 (up to 2026-12-07 the clamp was 88.7, and
// every x from 88.38 up gave 2^128's bits, infinity).
constexpr float kExpLo = -87.3f, kExpHi = 88.37f;
constexpr float kLog2e = 1.44269504088896341f;  // n = x * log2(e), rounded
static_assert(int32_t(kExpHi * kLog2e + 0.5f) == 127 && int32_t(kExpLo * kLog2e - 0.5f) == -126);

// exp(x) within 1 ulp (Cephes' expf polynomial on a range-reduced argument). The range reduction
// and the polynomial are fused multiply-adds (std::fma: one rounding each, the same bits on every
// CPU; the x86 levels and AArch64 run them as one instruction); every path of the engine uses this
// one definition, so results agree wherever it runs.
inline float exp_approx(float x) {
  x = x < kExpLo ? kExpLo : (x > kExpHi ? kExpHi : x);
  float t = x * kLog2e;
  float rounded = t + (t >= 0.0f ? 0.5f : -0.5f);  // nearest integer, ties away from zero
  // NaN passes the clamp; converting it to int is undefined, so convert 0 instead: r below is NaN
  // all the same and so is the result.
  int32_t ni = int32_t(x == x ? rounded : 0.0f);
  float n = float(ni);
  float r = std::fma(n, 2.12194440e-4f, std::fma(n, -0.693359375f, x));  // x - n ln2, in two parts
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  uint32_t bits = uint32_t(ni + 127) << 23;  // 2^n, n in [-126, 127]
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
// tanh(z) = 1 - 2 / (exp(2z) + 1), through exp_approx.
inline float tanh_approx(float z) { return 1.0f - 2.0f / (exp_approx(2.0f * z) + 1.0f); }

inline float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
inline ActValueGrad silu_value_grad(float x) {
  float s = sigmoid(x);
  return {x * s, s * std::fma(x, 1.0f - s, 1.0f)};
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
inline float gelu(float x) { return 0.5f * x * (1.0f + tanh_approx(kGeluC * (x + 0.044715f * x * x * x))); }
inline ActValueGrad gelu_value_grad(float x) {
  float th = tanh_approx(kGeluC * (x + 0.044715f * x * x * x));
  return {0.5f * x * (1.0f + th),
          0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluC * (1.0f + 3.0f * 0.044715f * x * x)};
}

// The f64 twins (the reference-only double path): exact std::exp / std::tanh
// and f64 constants, the formulas of the f32 functions above.
struct ActValueGrad64 {
  double value, grad;
};
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }
inline ActValueGrad64 silu_value_grad(double x) {
  double s = sigmoid(x);
  return {x * s, s * (1.0 + x * (1.0 - s))};
}
constexpr double kGeluC64 = 0.7978845608028654;
inline double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kGeluC64 * (x + 0.044715 * x * x * x))); }
inline ActValueGrad64 gelu_value_grad(double x) {
  double th = std::tanh(kGeluC64 * (x + 0.044715 * x * x * x));
  return {0.5 * x * (1.0 + th),
          0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * kGeluC64 * (1.0 + 3.0 * 0.044715 * x * x)};
}

// A strided [rows, F] view into a tensor's storage: element (r, f) at base[r * ld + f].
struct RowView {
  Tensor t;
  int64_t col0 = 0;  // first column inside t's rows
  int64_t ld = 0;    // row stride (elements)
};

// a [rows, F] = act(h0) * h1 for rows [0, rows). h0, h1, a: same dtype (f64: the f64 twins, in f64).
void gated_act_forward(Activation act, const RowView& h0, const RowView& h1, int64_t rows, int64_t F, Tensor& a);

// dh0 = da * h1 * act'(h0), dh1 = da * act(h0), rounded to the dtype.
void gated_act_backward(Activation act, const RowView& h0, const RowView& h1, const Tensor& da, int64_t rows,
                        int64_t F, const RowView& dh0, const RowView& dh1);

}  // namespace moe
