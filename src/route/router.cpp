#include "route/router.h"

#include <algorithm>
#include <cmath>

#include "kernels/grouped_gemm.h"
#include "moe/thread_pool.h"

namespace moe {
namespace {

// x in the router's type, or bf16 as it is: the GEMMs take a bf16 lhs with f32 weights or dout and
// give the bits of the f32 GEMM of x widened (grouped_gemm.h), without a widened copy.
Tensor router_operand(const Tensor& x, DType rt) {
  return x.dtype() == DType::bf16 && rt == DType::f32 ? x : x.to(rt);
}

// z [T, E] = x [T, D] @ W [D, E] in f32 (f64 on the double path): the grouped GEMM with one group
// (row-independent, so a token's logits do not depend on which other tokens share the call).
Tensor router_logits(const Tensor& x, const Tensor& W) {
  const int64_t T = x.dim(0), D = x.dim(1), E = W.dim(1);
  Tensor z(W.dtype(), {T, E});
  gmm(x, W.reshaped({1, D, E}), GroupLayout::from_sizes({T}), 0, z);
  return z;
}

// Real: float, or double on the f64 path (the same operations in the same order). The max is a
// plain scan (the first largest, as std::max_element): defined for rows with NaN, whose scores are
// then NaN and route by score_before.
template <class Real>
void softmax_row(const Real* z, Real* s, int64_t E) {
  Real m = z[0];
  for (int64_t e = 1; e < E; ++e)
    if (m < z[e]) m = z[e];
  Real sum = Real(0);
  for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(z[e] - m));
  for (int64_t e = 0; e < E; ++e) s[e] /= sum;
}

// NaN sorts below every number so the order stays a strict weak ordering.
template <class Real>
bool score_before(Real a, int32_t ia, Real b, int32_t ib) {
  bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// The K first ids in score_before's order (a strict total order: equal scores by lower id), best
// first: each id is inserted into the sorted list of the best so far, or passed over after one
// comparison with its last (the ids std::partial_sort gives).
template <class Real>
void select_topk(const Real* s, int64_t E, int64_t K, int32_t* idx) {
  int64_t n = 0;
  for (int32_t e = 0; e < int32_t(E); ++e) {
    if (n == K && !score_before(s[e], e, s[idx[K - 1]], idx[K - 1])) continue;
    int64_t i = n < K ? n++ : K - 1;
    for (; i > 0 && score_before(s[e], e, s[idx[i - 1]], idx[i - 1]); --i) idx[i] = idx[i - 1];
    idx[i] = e;
  }
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

// The sigmoid scores' normalization epsilon, in the router's type.
template <class Real>
constexpr Real kSigmoidEps = 1e-20f;
template <>
constexpr double kSigmoidEps<double> = 1e-20;

template <class Real>
RouterOutput router_forward_t(const Config& cfg, const Tensor& x, const Tensor& kernel,
                              const Tensor* forced) {
  const int64_t T = x.dim(0), E = cfg.num_experts, K = cfg.num_experts_per_tok;
  const bool sigmoid = cfg.routed_score_func == ScoreFunc::sigmoid;
  const DType rt = dtype_of<Real>::value;
  if (forced) check_forced(*forced, T, K, E);
  RouterOutput r;
  // The logits read x widened exactly (bf16 -> f32, in the GEMM's tiles): no f32 copy of x is made
  // or kept.
  r.x = x;
  r.logits = router_logits(router_operand(x, rt), kernel.to(rt));
  r.scores = Tensor::empty(rt, {T, E});
  r.topk_idx = Tensor::empty(DType::i32, {T, K});
  r.topk_scores = Tensor::empty(rt, {T, K});
  r.topk_weights = Tensor::empty(rt, {T, K});
  parallel_for(T, 32, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const Real* z = r.logits.data<Real>() + t * E;
      Real* s = r.scores.data<Real>() + t * E;
      if (sigmoid)
        for (int64_t j = 0; j < E; ++j) s[j] = Real(1) / (Real(1) + std::exp(-z[j]));
      else
        softmax_row(z, s, E);
      int32_t* idx = r.topk_idx.data<int32_t>() + t * K;
      if (forced)
        std::copy_n(forced->data<int32_t>() + t * K, K, idx);
      else
        select_topk(s, E, K, idx);
      Real* raw = r.topk_scores.data<Real>() + t * K;
      Real* w = r.topk_weights.data<Real>() + t * K;
      Real sum = Real(0);
      for (int64_t k = 0; k < K; ++k) sum += (raw[k] = s[idx[k]]);
      Real denom = cfg.norm_topk_prob ? sum + (sigmoid ? kSigmoidEps<Real> : Real(0)) : Real(1);
      for (int64_t k = 0; k < K; ++k) w[k] = raw[k] / denom * Real(cfg.routed_scaling_factor);
    }
  });
  return r;
}

template <class Real>
Tensor router_weights_backward_t(const Config& cfg, const RouterOutput& r, const Tensor& dW) {
  const int64_t T = r.logits.dim(0), E = r.logits.dim(1), K = r.topk_idx.dim(1);
  const bool sigmoid = cfg.routed_score_func == ScoreFunc::sigmoid;
  Tensor dz(dtype_of<Real>::value, {T, E});
  parallel_for(T, 32, [&](int64_t b, int64_t e) {
    std::vector<Real> ds(static_cast<size_t>(E));
    for (int64_t t = b; t < e; ++t) {
      const Real* raw = r.topk_scores.data<Real>() + t * K;
      const Real* g = dW.data<Real>() + t * K;
      const int32_t* idx = r.topk_idx.data<int32_t>() + t * K;
      const Real* s = r.scores.data<Real>() + t * E;
      Real scale = Real(cfg.routed_scaling_factor);
      std::fill(ds.begin(), ds.end(), Real(0));
      if (cfg.norm_topk_prob) {
        // w_k = scale * raw_k / S, S = sum raw (+eps): dw/draw_j = scale * (g_j / S - sum_k g_k raw_k / S^2).
        Real S = Real(0), gr = Real(0);
        for (int64_t k = 0; k < K; ++k) S += raw[k];
        if (sigmoid) S += kSigmoidEps<Real>;
        for (int64_t k = 0; k < K; ++k) gr += g[k] * raw[k];
        for (int64_t k = 0; k < K; ++k) ds[size_t(idx[k])] += scale * (g[k] / S - gr / (S * S));
      } else {
        for (int64_t k = 0; k < K; ++k) ds[size_t(idx[k])] += scale * g[k];
      }
      Real* out = dz.data<Real>() + t * E;
      if (sigmoid) {
        for (int64_t j = 0; j < E; ++j) out[j] = ds[size_t(j)] * s[j] * (Real(1) - s[j]);
      } else {
        Real dot = Real(0);
        for (int64_t j = 0; j < E; ++j) dot += ds[size_t(j)] * s[j];
        for (int64_t j = 0; j < E; ++j) out[j] = s[j] * (ds[size_t(j)] - dot);
      }
    }
  });
  return dz;
}

}  // namespace

// The f64 path (an f64 x) runs every step in double; anything else in f32.
RouterOutput router_forward(const Config& cfg, const Tensor& x, const Tensor& kernel, const Tensor* forced) {
  return x.dtype() == DType::f64 ? router_forward_t<double>(cfg, x, kernel, forced)
                                 : router_forward_t<float>(cfg, x, kernel, forced);
}

Tensor router_weights_backward(const Config& cfg, const RouterOutput& r, const Tensor& dW) {
  return r.logits.dtype() == DType::f64 ? router_weights_backward_t<double>(cfg, r, dW)
                                        : router_weights_backward_t<float>(cfg, r, dW);
}

// dkernel [D, E] = x^T @ dz; dx [T, D] += dz @ W^T (f32 grouped GEMMs with one group).
void router_matmul_backward(const Tensor& x, const Tensor& W, const Tensor& dz, Tensor& dkernel, Tensor& dx) {
  const int64_t T = x.dim(0), D = x.dim(1), E = W.dim(1);
  const GroupLayout all = GroupLayout::from_sizes({T});
  Tensor dk = dkernel.reshaped({1, D, E});
  gmm_drhs(router_operand(x, dz.dtype()), dz, all, 0, dk);
  // dx is its own addend: each element dx + its chain, the sum an add pass over a separate product
  // gives, without that product written and read back.
  gmm_dlhs_add(dz, W.reshaped({1, D, E}), all, 0, dx, dx);
}

}  // namespace moe
