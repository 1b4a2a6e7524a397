// Gated activation of the expert FFN (SPEC.md §2 step 5): a = act(h0) * h1,
// computed in f32 from the stored h values and rounded once to the output
// type. The scalar functions are inline so a fused GEMM epilogue computes the
// same bits as these kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "moe/config.h"
#include "moe/tensor.h"

namespace moe {

// Each activation's value and derivative from one transcendental (the
// backward needs both; one exp / tanh per element instead of two).
struct ActValueGrad {
  float value, grad;
};

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
inline ActValueGrad silu_value_grad(float x) {
  float s = sigmoid(x);
  return {x * s, s * (1.0f + x * (1.0f - s))};
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
inline float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kGeluC * (x + 0.044715f * x * x * x))); }
inline ActValueGrad gelu_value_grad(float x) {
  float th = std::tanh(kGeluC * (x + 0.044715f * x * x * x));
  return {0.5f * x * (1.0f + th),
          0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluC * (1.0f + 3.0f * 0.044715f * x * x)};
}

// A strided [rows, F] view into a tensor's storage: element (r, f) at base[r * ld + f].
struct RowView {
  Tensor t;
  int64_t col0 = 0;  // first column inside t's rows
  int64_t ld = 0;    // row stride (elements)
};

// a [rows, F] = act(h0) * h1 for rows [0, rows). h0, h1, a: same dtype.
void gated_act_forward(Activation act, const RowView& h0, const RowView& h1, int64_t rows, int64_t F, Tensor& a);

// dh0 = da * h1 * act'(h0), dh1 = da * act(h0), rounded to the dtype.
void gated_act_backward(Activation act, const RowView& h0, const RowView& h1, const Tensor& da, int64_t rows,
                        int64_t F, const RowView& dh0, const RowView& dh1);

}  // namespace moe
