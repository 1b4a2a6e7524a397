#include "route/aux_loss.h"

#include <algorithm>
#include <cmath>

namespace moe {
namespace {
// softmax(z) and logsumexp(z) of one row. Real: float, or double on the f64 path (same operations).
template <class Real>
Real softmax_lse(const Real* z, Real* p, int64_t E) {
  Real m = *std::max_element(z, z + E);
  Real sum = Real(0);
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - m));
  for (int64_t e = 0; e < E; ++e) p[e] /= sum;
  return m + std::log(sum);
}

constexpr double kProbUnit = 1152921504606846976.0;  // 2^60
constexpr double kLseUnit = 1099511627776.0;         // 2^40

FixedSum to_fixed(double v, double unit) { return FixedSum(std::llround(v * unit)); }
double from_fixed(FixedSum v, double unit) { return double(v) / unit; }
}  // namespace

void AuxStats::add(const AuxStats& o) {
  MOE_ASSERT(o.prob_sum.size() == prob_sum.size(), "AuxStats::add: expert counts differ");
  for (size_t e = 0; e < prob_sum.size(); ++e) {
    prob_sum[e] += o.prob_sum[e];
    routed_counts[e] += o.routed_counts[e];
  }
  lse_sq_sum += o.lse_sq_sum;
  tokens += o.tokens;
}

namespace {
template <class Real>
AuxStats aux_stats_t(const Tensor& logits, const std::vector<int64_t>& routed_counts) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  AuxStats st;
  st.prob_sum.assign(size_t(E), 0);
  st.routed_counts = routed_counts;
  st.tokens = T;
  std::vector<Real> p(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    Real lse = softmax_lse(logits.data<Real>() + t * E, p.data(), E);
    for (int64_t e = 0; e < E; ++e) st.prob_sum[size_t(e)] += to_fixed(p[size_t(e)], kProbUnit);
    st.lse_sq_sum += to_fixed(double(lse) * double(lse), kLseUnit);
  }
  return st;
}
}  // namespace

AuxStats aux_stats(const Tensor& logits, const std::vector<int64_t>& routed_counts) {
  return logits.dtype() == DType::f64 ? aux_stats_t<double>(logits, routed_counts)
                                      : aux_stats_t<float>(logits, routed_counts);
}

AuxLosses aux_losses(const Config& cfg, const AuxStats& g) {
  AuxLosses out;
  const double T = double(std::max<int64_t>(g.tokens, 1));
  const size_t E = g.prob_sum.size();
  double lb = 0.0;
  for (size_t e = 0; e < E; ++e) lb += (double(g.routed_counts[e]) / T) * (from_fixed(g.prob_sum[e], kProbUnit) / T);
  out.load_balance_f64 = cfg.load_balance_loss_weight * double(E) * lb;
  out.z_loss_f64 = cfg.router_z_loss_weight * from_fixed(g.lse_sq_sum, kLseUnit) / T;
  out.load_balance = float(out.load_balance_f64);
  out.z_loss = float(out.z_loss_f64);
  return out;
}

namespace {
template <class Real>
void aux_backward_t(const Config& cfg, const Tensor& logits, const AuxStats& g, Tensor& dlogits,
                    const AuxCotangents& s) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const double Tg = double(std::max<int64_t>(g.tokens, 1));
  // w * 1.0 == w exactly: the default cotangents keep the bits.
  const double wlb = cfg.load_balance_loss_weight * s.load_balance, wz = cfg.router_z_loss_weight * s.z_loss;
  if (wlb == 0.0 && wz == 0.0) return;
  // d lb / d p[t, e] = wlb * E * c_e / T^2 (constant over t).
  std::vector<Real> dp(static_cast<size_t>(E)), p(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    dp[size_t(e)] = Real(wlb * double(E) * double(g.routed_counts[size_t(e)]) / (Tg * Tg));
  for (int64_t t = 0; t < T; ++t) {
    Real lse = softmax_lse(logits.data<Real>() + t * E, p.data(), E);
    Real dot = Real(0);
    for (int64_t e = 0; e < E; ++e) dot += dp[size_t(e)] * p[size_t(e)];
    // d z-loss / d z[t, e] = wz * 2 * lse_t * p[t, e] / T.
    Real zc = Real(wz * 2.0 * double(lse) / Tg);
    Real* out = dlogits.data<Real>() + t * E;
    for (int64_t e = 0; e < E; ++e) out[e] += p[size_t(e)] * (dp[size_t(e)] - dot) + zc * p[size_t(e)];
  }
}
}  // namespace

void aux_backward(const Config& cfg, const Tensor& logits, const AuxStats& g, Tensor& dlogits,
                  const AuxCotangents& s) {
  logits.dtype() == DType::f64 ? aux_backward_t<double>(cfg, logits, g, dlogits, s)
                               : aux_backward_t<float>(cfg, logits, g, dlogits, s);
}

}  // namespace moe
