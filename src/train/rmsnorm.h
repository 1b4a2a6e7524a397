// RMSNorm with a learned scale, the pre-norm of every block:
//   y[t] = x[t] / sqrt(mean_d(x[t]^2) + eps) * scale,  eps = 1e-6.
// Everything f32.
#pragma once

#include "moe/tensor.h"

namespace moe::train {

constexpr float kRmsEps = 1e-6f;

struct RmsNormOut {
  Tensor y;        // [T, D] f32
  Tensor inv_rms;  // [T] f32: 1 / sqrt(mean(x^2) + eps), kept for the backward
};

// x: [T, D] f32, scale: [D] f32.
RmsNormOut rmsnorm_forward(const Tensor& x, const Tensor& scale);

struct RmsNormGrads {
  Tensor dx;      // [T, D] f32
  Tensor dscale;  // [D] f32
};

// Adjoint of rmsnorm_forward for upstream dy [T, D] f32:
//   dscale[d] = sum_t dy[t,d] * x[t,d] * r[t]
//   dx[t] = r[t] * (g[t] - x[t] * r[t]^2 * mean_d(g[t] * x[t])),  g = dy * scale.
RmsNormGrads rmsnorm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dy);

}  // namespace moe::train
