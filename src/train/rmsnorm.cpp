#include "train/rmsnorm.h"

#include <cmath>

namespace moe::train {
namespace {
void check(const Tensor& x, const Tensor& scale, const char* op) {
  if (x.dtype() != DType::f32 || x.ndim() != 2)
    fail("[", op, "] x: expected [T, D] f32, got ", shape_str(x.shape()));
  expect_shape(scale, {x.dim(1)}, std::string("[") + op + "] scale");
  if (scale.dtype() != DType::f32) fail("[", op, "] scale: expected f32");
}
}  // namespace

RmsNormOut rmsnorm_forward(const Tensor& x, const Tensor& scale) {
  check(x, scale, "rmsnorm");
  const int64_t T = x.dim(0), D = x.dim(1);
  RmsNormOut o{Tensor::empty(DType::f32, {T, D}), Tensor::empty(DType::f32, {T})};
  const float* px = x.data<float>();
  const float* s = scale.data<float>();
  float* py = o.y.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* row = px + t * D;
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(row[d]) * row[d];
    const float r = float(1.0 / std::sqrt(ss / double(D) + kRmsEps));
    o.inv_rms.data<float>()[t] = r;
    for (int64_t d = 0; d < D; ++d) py[t * D + d] = row[d] * r * s[d];
  }
  return o;
}

RmsNormGrads rmsnorm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dy) {
  check(x, scale, "rmsnorm_backward");
  const int64_t T = x.dim(0), D = x.dim(1);
  expect_shape(dy, {T, D}, "[rmsnorm_backward] dy");
  expect_shape(inv_rms, {T}, "[rmsnorm_backward] inv_rms");
  RmsNormGrads g{Tensor::empty(DType::f32, {T, D}), Tensor(DType::f32, {D})};
  const float *px = x.data<float>(), *s = scale.data<float>(), *pdy = dy.data<float>();
  float *pdx = g.dx.data<float>(), *ds = g.dscale.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float r = inv_rms.data<float>()[t];
    const float *xr = px + t * D, *dyr = pdy + t * D;
    double dot = 0;  // sum_d g[d] * x[d]
    for (int64_t d = 0; d < D; ++d) {
      dot += double(dyr[d]) * s[d] * xr[d];
      ds[d] += dyr[d] * xr[d] * r;
    }
    const float c = float(dot / double(D)) * r * r;
    for (int64_t d = 0; d < D; ++d) pdx[t * D + d] = r * (dyr[d] * s[d] - xr[d] * c);
  }
  return g;
}

}  // namespace moe::train
