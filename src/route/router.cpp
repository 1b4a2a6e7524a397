#include "route/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moe/thread_pool.h"

namespace moe {
namespace {

template <class In>
void logits_rows(const In* x, const float* W, float* z, int64_t D, int64_t E, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    float* zt = z + t * E;
    std::fill(zt, zt + E, 0.0f);
    for (int64_t d = 0; d < D; ++d) {
      float xv = load_f32(x[t * D + d]);
      const float* w = W + d * E;
      for (int64_t e = 0; e < E; ++e) zt[e] += xv * w[e];
    }
  }
}

// z [T, E] = x [T, D] @ W [D, E]; each row one sequential sum over d.
Tensor router_logits(const Tensor& x, const Tensor& W) {
  int64_t T = x.dim(0), D = x.dim(1), E = W.dim(1);
  Tensor z = Tensor::empty(DType::f32, {T, E});
  parallel_for(T, 8, [&](int64_t b, int64_t e) {
    if (x.dtype() == DType::bf16)
      logits_rows(x.data<bf16>(), W.data<float>(), z.data<float>(), D, E, b, e);
    else
      logits_rows(x.data<float>(), W.data<float>(), z.data<float>(), D, E, b, e);
  });
  return z;
}

void softmax_row(const float* z, float* s, int64_t E) {
  float m = *std::max_element(z, z + E);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(z[e] - m));
  for (int64_t e = 0; e < E; ++e) s[e] /= sum;
}

// NaN sorts below every number so the order stays a strict weak ordering.
bool score_before(float a, int32_t ia, float b, int32_t ib) {
  bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

void select_topk(const float* s, int64_t E, int64_t K, int32_t* idx) {
  std::vector<int32_t> ids(static_cast<size_t>(E));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + K, ids.end(),
                    [&](int32_t a, int32_t b) { return score_before(s[a], a, s[b], b); });
  std::copy(ids.begin(), ids.begin() + K, idx);
}

void check_forced(const Tensor& f, int64_t T, int64_t K, int64_t E) {
  if (f.dtype() != DType::i32) fail("topk_idx: expected dtype i32, got ", dtype_name(f.dtype()));
  expect_shape(f, {T, K}, "topk_idx");
  const int32_t* p = f.data<int32_t>();
  for (int64_t i = 0; i < T * K; ++i)
    if (p[i] < 0 || p[i] >= E)
      fail("topk_idx: token ", i / K, " slot ", i % K, " names expert ", p[i], ", expected 0 <= id < ", E);
}

}  // namespace

RouterOutput router_forward(const Config& cfg, const Tensor& x, const Tensor& kernel, const Tensor* forced) {
  const int64_t T = x.dim(0), E = cfg.num_experts, K = cfg.num_experts_per_tok;
  const bool sigmoid = cfg.routed_score_func == ScoreFunc::sigmoid;
  if (forced) check_forced(*forced, T, K, E);
  RouterOutput r;
  r.logits = router_logits(x, kernel);
  r.scores = Tensor::empty(DType::f32, {T, E});
  r.topk_idx = Tensor::empty(DType::i32, {T, K});
  r.topk_scores = Tensor::empty(DType::f32, {T, K});
  r.topk_weights = Tensor::empty(DType::f32, {T, K});
  parallel_for(T, 32, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* z = r.logits.data<float>() + t * E;
      float* s = r.scores.data<float>() + t * E;
      if (sigmoid)
        for (int64_t j = 0; j < E; ++j) s[j] = 1.0f / (1.0f + std::exp(-z[j]));
      else
        softmax_row(z, s, E);
      int32_t* idx = r.topk_idx.data<int32_t>() + t * K;
      if (forced)
        std::copy_n(forced->data<int32_t>() + t * K, K, idx);
      else
        select_topk(s, E, K, idx);
      float* raw = r.topk_scores.data<float>() + t * K;
      float* w = r.topk_weights.data<float>() + t * K;
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += (raw[k] = s[idx[k]]);
      float denom = cfg.norm_topk_prob ? sum + (sigmoid ? 1e-20f : 0.0f) : 1.0f;
      for (int64_t k = 0; k < K; ++k) w[k] = raw[k] / denom * float(cfg.routed_scaling_factor);
    }
  });
  return r;
}

Tensor router_weights_backward(const Config& cfg, const RouterOutput& r, const Tensor& dW) {
  const int64_t T = r.logits.dim(0), E = r.logits.dim(1), K = r.topk_idx.dim(1);
  const bool sigmoid = cfg.routed_score_func == ScoreFunc::sigmoid;
  Tensor dz(DType::f32, {T, E});
  parallel_for(T, 32, [&](int64_t b, int64_t e) {
    std::vector<float> ds(static_cast<size_t>(E));
    for (int64_t t = b; t < e; ++t) {
      const float* raw = r.topk_scores.data<float>() + t * K;
      const float* g = dW.data<float>() + t * K;
      const int32_t* idx = r.topk_idx.data<int32_t>() + t * K;
      const float* s = r.scores.data<float>() + t * E;
      float scale = float(cfg.routed_scaling_factor);
      std::fill(ds.begin(), ds.end(), 0.0f);
      if (cfg.norm_topk_prob) {
        // w_k = scale * raw_k / S, S = sum raw (+eps): dw/draw_j = scale * (g_j / S - sum_k g_k raw_k / S^2).
        float S = 0.0f, gr = 0.0f;
        for (int64_t k = 0; k < K; ++k) S += raw[k];
        if (sigmoid) S += 1e-20f;
        for (int64_t k = 0; k < K; ++k) gr += g[k] * raw[k];
        for (int64_t k = 0; k < K; ++k) ds[size_t(idx[k])] += scale * (g[k] / S - gr / (S * S));
      } else {
        for (int64_t k = 0; k < K; ++k) ds[size_t(idx[k])] += scale * g[k];
      }
      float* out = dz.data<float>() + t * E;
      if (sigmoid) {
        for (int64_t j = 0; j < E; ++j) out[j] = ds[size_t(j)] * s[j] * (1.0f - s[j]);
      } else {
        float dot = 0.0f;
        for (int64_t j = 0; j < E; ++j) dot += ds[size_t(j)] * s[j];
        for (int64_t j = 0; j < E; ++j) out[j] = s[j] * (ds[size_t(j)] - dot);
      }
    }
  });
  return dz;
}

namespace {
template <class In>
void dx_rows(const float* dz, const float* W, float* dx, int64_t D, int64_t E, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t e = 0; e < E; ++e) acc += dz[t * E + e] * W[d * E + e];
      dx[t * D + d] += acc;
    }
}
template <class In>
void dkernel_rows(const In* x, const float* dz, float* dk, int64_t T, int64_t D, int64_t E, int64_t d0,
                  int64_t d1) {
  for (int64_t d = d0; d < d1; ++d) {
    float* row = dk + d * E;
    std::fill(row, row + E, 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      float xv = load_f32(x[t * D + d]);
      for (int64_t e = 0; e < E; ++e) row[e] += xv * dz[t * E + e];
    }
  }
}
}  // namespace

void router_matmul_backward(const Tensor& x, const Tensor& W, const Tensor& dz, Tensor& dkernel, Tensor& dx) {
  int64_t T = x.dim(0), D = x.dim(1), E = W.dim(1);
  bool bf = x.dtype() == DType::bf16;
  parallel_for(D, 16, [&](int64_t b, int64_t e) {
    if (bf)
      dkernel_rows(x.data<bf16>(), dz.data<float>(), dkernel.data<float>(), T, D, E, b, e);
    else
      dkernel_rows(x.data<float>(), dz.data<float>(), dkernel.data<float>(), T, D, E, b, e);
  });
  parallel_for(T, 8, [&](int64_t b, int64_t e) {
    dx_rows<float>(dz.data<float>(), W.data<float>(), dx.data<float>(), D, E, b, e);
  });
}

}  // namespace moe
