#include "route/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/grouped_gemm.h"
#include "moe/thread_pool.h"

namespace moe {
namespace {

// z [T, E] = x [T, D] @ W [D, E] in f32: the grouped GEMM with one group (row-independent, so
// a token's logits do not depend on which other tokens share the call).
Tensor router_logits(const Tensor& x_f32, const Tensor& W) {
  const int64_t T = x_f32.dim(0), D = x_f32.dim(1), E = W.dim(1);
  Tensor z(DType::f32, {T, E});
  gmm(x_f32, W.reshaped({1, D, E}), GroupLayout::from_sizes({T}), 0, z);
  return z;
}

// The max is a plain scan (the first largest, as std::max_element): defined for rows with NaN,
// whose scores are then NaN and route by score_before.
void softmax_row(const float* z, float* s, int64_t E) {
  float m = z[0];
  for (int64_t e = 1; e < E; ++e)
    if (m < z[e]) m = z[e];
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

// ids: scratch of E entries, reused across tokens.
void select_topk(const float* s, int64_t E, int64_t K, int32_t* idx, std::vector<int32_t>& ids) {
  ids.resize(size_t(E));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + K, ids.end(),
                    [&](int32_t a, int32_t b) { return score_before(s[a], a, s[b], b); });
  std::copy(ids.begin(), ids.begin() + K, idx);
}

// Forced routing [T, K] i32: every id in [0, E), the K ids of a token distinct
// (a token routed twice to one expert would count twice in its group).
void check_forced(const Tensor& f, int64_t T, int64_t K, int64_t E) {
  if (f.dtype() != DType::i32) fail("topk_idx: expected dtype i32, got ", dtype_name(f.dtype()));
  expect_shape(f, {T, K}, "topk_idx");
  const int32_t* p = f.data<int32_t>();
  for (int64_t i = 0; i < T * K; ++i) {
    if (p[i] < 0 || p[i] >= E)
      fail("topk_idx: token ", i / K, " slot ", i % K, " names expert ", p[i], ", expected 0 <= id < ", E);
    for (int64_t j = i - i % K; j < i; ++j)
      if (p[j] == p[i])
        fail("topk_idx: token ", i / K, " names expert ", p[i], " twice (slots ", j % K, " and ", i % K,
             "); a token's K experts must differ");
  }
}

}  // namespace

RouterOutput router_forward(const Config& cfg, const Tensor& x, const Tensor& kernel, const Tensor* forced) {
  const int64_t T = x.dim(0), E = cfg.num_experts, K = cfg.num_experts_per_tok;
  const bool sigmoid = cfg.routed_score_func == ScoreFunc::sigmoid;
  if (forced) check_forced(*forced, T, K, E);
  RouterOutput r;
  r.x_f32 = x.to(DType::f32);
  r.logits = router_logits(r.x_f32, kernel);
  r.scores = Tensor::empty(DType::f32, {T, E});
  r.topk_idx = Tensor::empty(DType::i32, {T, K});
  r.topk_scores = Tensor::empty(DType::f32, {T, K});
  r.topk_weights = Tensor::empty(DType::f32, {T, K});
  parallel_for(T, 32, [&](int64_t b, int64_t e) {
    std::vector<int32_t> ids;
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
        select_topk(s, E, K, idx, ids);
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

// dkernel [D, E] = x^T @ dz; dx [T, D] += dz @ W^T (f32 grouped GEMMs with one group).
void router_matmul_backward(const Tensor& x, const Tensor& W, const Tensor& dz, Tensor& dkernel, Tensor& dx) {
  const int64_t T = x.dim(0), D = x.dim(1), E = W.dim(1);
  const GroupLayout all = GroupLayout::from_sizes({T});
  Tensor dk = dkernel.reshaped({1, D, E});
  gmm_drhs(x.to(DType::f32), dz, all, 0, dk);
  Tensor part(DType::f32, {T, D});
  gmm_dlhs(dz, W.reshaped({1, D, E}), all, 0, part);
  float* out = dx.data<float>();
  const float* p = part.data<float>();
  parallel_for(T * D, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] += p[i];
  });
}

}  // namespace moe
