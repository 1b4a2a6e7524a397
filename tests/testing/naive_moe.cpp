#include "testing/naive_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moe::testing {
namespace {
std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.get_f64(i);  // exact for f32, bf16 and f64
  return v;
}
double act(const Config& c, double x) {
  if (c.mlp_activation == Activation::silu) return x / (1 + std::exp(-x));
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
}  // namespace

NaiveParams naive_params(const Config& cfg, const LayerWeights& w, const Tensor& x) {
  const int64_t E = cfg.num_experts, D = cfg.emb_dim, F = cfg.moe_mlp_dim;
  NaiveParams p;
  p.router = to_doubles(w.router);
  p.wo = to_doubles(w.wo);
  p.x = to_doubles(x);
  if (!cfg.prefuse_moe_weights) {
    p.wi0 = to_doubles(w.wi_0);
    p.wi1 = to_doubles(w.wi_1);
    return p;
  }
  std::vector<double> wi = to_doubles(w.wi);  // [E, D, 2F] (the split layout is the same bytes)
  p.wi0.resize(size_t(E * D * F));
  p.wi1.resize(size_t(E * D * F));
  for (int64_t i = 0; i < E * D; ++i)
    for (int64_t f = 0; f < F; ++f) {
      p.wi0[size_t(i * F + f)] = wi[size_t(i * 2 * F + f)];
      p.wi1[size_t(i * F + f)] = wi[size_t(i * 2 * F + F + f)];
    }
  return p;
}

NaiveResult naive_forward(const Config& c, const NaiveParams& p, int64_t T, const std::vector<double>& dy,
                          const std::vector<int>* forced) {
  const int64_t E = c.num_experts, D = c.emb_dim, F = c.moe_mlp_dim, K = c.num_experts_per_tok;
  const bool sig = c.routed_score_func == ScoreFunc::sigmoid;
  NaiveResult r;
  r.y.assign(size_t(T * D), 0.0);
  r.idx.resize(size_t(T * K));
  r.w.resize(size_t(T * K));
  std::vector<double> probsum(size_t(E), 0.0), count(size_t(E), 0.0);
  double lse_sq = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> z(size_t(E), 0.0), s(static_cast<size_t>(E)), sm(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t d = 0; d < D; ++d) z[size_t(e)] += p.x[size_t(t * D + d)] * p.router[size_t(d * E + e)];
    double m = *std::max_element(z.begin(), z.end()), sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(z[size_t(e)] - m);
    for (int64_t e = 0; e < E; ++e) sm[size_t(e)] = std::exp(z[size_t(e)] - m) / sum;
    lse_sq += (m + std::log(sum)) * (m + std::log(sum));
    for (int64_t e = 0; e < E; ++e) {
      s[size_t(e)] = sig ? 1 / (1 + std::exp(-z[size_t(e)])) : sm[size_t(e)];
      probsum[size_t(e)] += sm[size_t(e)];
    }
    std::vector<int> ids(static_cast<size_t>(E));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return s[size_t(a)] > s[size_t(b)]; });
    double tot = 0;
    for (int64_t k = 0; k < K; ++k) {
      int e = forced ? (*forced)[size_t(t * K + k)] : ids[size_t(k)];
      r.idx[size_t(t * K + k)] = e;
      tot += s[size_t(e)];
      count[size_t(e)] += 1;
    }
    double denom = c.norm_topk_prob ? tot + (sig ? 1e-20 : 0.0) : 1.0;
    for (int64_t k = 0; k < K; ++k)
      r.w[size_t(t * K + k)] = s[size_t(r.idx[size_t(t * K + k)])] / denom * c.routed_scaling_factor;
  }
  r.lb = c.load_balance_loss_weight * double(E) *
         std::inner_product(count.begin(), count.end(), probsum.begin(), 0.0) / double(T * T);
  r.zl = c.router_z_loss_weight * lse_sq / double(T);
  // Capacity: per expert, the earliest slots in flat (token, slot) order.
  double cap = c.capacity_factor > 0 ? std::ceil(double(T * K) / double(E) * c.capacity_factor) : 1e300;
  std::vector<double> used(size_t(E), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      int e = r.idx[size_t(t * K + k)];
      if (used[size_t(e)]++ >= cap) continue;
      std::vector<double> a(static_cast<size_t>(F));
      for (int64_t f = 0; f < F; ++f) {
        double h0 = 0, h1 = 0;
        for (int64_t d = 0; d < D; ++d) {
          h0 += p.x[size_t(t * D + d)] * p.wi0[size_t((e * D + d) * F + f)];
          h1 += p.x[size_t(t * D + d)] * p.wi1[size_t((e * D + d) * F + f)];
        }
        a[size_t(f)] = act(c, h0) * h1;
      }
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t f = 0; f < F; ++f) o += a[size_t(f)] * p.wo[size_t((e * F + f) * D + d)];
        r.y[size_t(t * D + d)] += r.w[size_t(t * K + k)] * o;
      }
    }
  r.loss = r.lb + r.zl;
  for (size_t i = 0; i < r.y.size(); ++i) r.loss += r.y[i] * dy[i];
  return r;
}

}  // namespace moe::testing
