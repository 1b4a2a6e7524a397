#include "route/aux_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "moe/thread_pool.h"

namespace moe {
namespace {
// softmax(z) and logsumexp(z) of one row. Real: float, or double on the f64 path (same
// operations). The max is a plain scan (the first largest, as std::max_element): defined for rows
// with NaN too (aux_backward).
template <class Real>
Real softmax_lse(const Real* z, Real* p, int64_t E) {
  Real m = z[0];
  for (int64_t e = 1; e < E; ++e)
    if (m < z[e]) m = z[e];
  Real sum = Real(0);
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - m));
  for (int64_t e = 0; e < E; ++e) p[e] /= sum;
  return m + std::log(sum);
}

template <class Real>
bool finite_row(const Real* z, int64_t E) {
  for (int64_t e = 0; e < E; ++e)
    if (!std::isfinite(z[e])) return false;
  return true;
}

constexpr double kProbUnit = 1152921504606846976.0;  // 2^60
constexpr double kLseUnit = 1099511627776.0;         // 2^40
constexpr double kTermLimit = 0x1p126;               // one term must stay below it (in units)

// v * unit rounded to nearest, halfway away from zero (llround's rounding, without its 2^63 limit;
// the same bits wherever llround is defined). Needs |v * unit| < kTermLimit.
FixedSum to_fixed(double v, double unit) { return FixedSum(std::round(v * unit)); }
double from_fixed(FixedSum v, double unit) { return double(v) / unit; }

// sum += term; false when the sum leaves the __int128 range (terms are >= 0, so whether some
// grouping overflows does not depend on the grouping: iff the total does).
bool add_fixed(FixedSum& sum, FixedSum term) { return !__builtin_add_overflow(sum, term, &sum); }
}  // namespace

void AuxStats::add(const AuxStats& o) {
  MOE_ASSERT(o.prob_sum.size() == prob_sum.size(), "AuxStats::add: expert counts differ");
  for (size_t e = 0; e < prob_sum.size(); ++e) {
    prob_sum[e] += o.prob_sum[e];
    routed_counts[e] += o.routed_counts[e];
  }
  if (o.lse_overflow || !add_fixed(lse_sq_sum, o.lse_sq_sum)) lse_overflow = 1;
  tokens += o.tokens;
  nonfinite += o.nonfinite;
}

namespace {
template <class Real>
AuxStats aux_stats_t(const Tensor& logits, const std::vector<int64_t>& routed_counts) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  AuxStats st;
  st.prob_sum.assign(size_t(E), 0);
  st.routed_counts = routed_counts;
  // Ranges of tokens in parallel, each into its own partial sums, added under a lock: the sums are
  // integers (fixed point) of terms >= 0, so neither their grouping nor the order of the adds
  // changes a bit, nor whether the lse sum overflows (AuxStats::add).
  std::mutex mu;
  parallel_for(T, 64, [&](int64_t b, int64_t e_end) {
    AuxStats part;
    part.prob_sum.assign(size_t(E), 0);
    part.routed_counts.assign(size_t(E), 0);
    part.tokens = e_end - b;
    std::vector<Real> p(static_cast<size_t>(E));
    for (int64_t t = b; t < e_end; ++t) {
      const Real* z = logits.data<Real>() + t * E;
      if (!finite_row(z, E)) {  // left out of the sums: they stay exact integers
        ++part.nonfinite;
        continue;
      }
      Real lse = softmax_lse(z, p.data(), E);
      for (int64_t e = 0; e < E; ++e) part.prob_sum[size_t(e)] += to_fixed(p[size_t(e)], kProbUnit);
      const double sq = double(lse) * double(lse);  // finite: |lse| <= f32 max
      if (part.lse_overflow || !(sq * kLseUnit < kTermLimit) ||
          !add_fixed(part.lse_sq_sum, to_fixed(sq, kLseUnit)))
        part.lse_overflow = 1;
    }
    std::lock_guard<std::mutex> lock(mu);
    st.add(part);
  });
  return st;
}
}  // namespace

AuxStats aux_stats(const Tensor& logits, const std::vector<int64_t>& routed_counts) {
  return logits.dtype() == DType::f64 ? aux_stats_t<double>(logits, routed_counts)
                                      : aux_stats_t<float>(logits, routed_counts);
}

AuxLosses aux_losses(const Config& cfg, const AuxStats& g) {
  AuxLosses out;
  if (g.nonfinite > 0) {  // whatever the weights: weight * NaN is NaN
    out.load_balance = out.z_loss = std::numeric_limits<float>::quiet_NaN();
    out.load_balance_f64 = out.z_loss_f64 = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  const double T = double(std::max<int64_t>(g.tokens, 1));
  const size_t E = g.prob_sum.size();
  double lb = 0.0;
  for (size_t e = 0; e < E; ++e) lb += (double(g.routed_counts[e]) / T) * (from_fixed(g.prob_sum[e], kProbUnit) / T);
  out.load_balance_f64 = cfg.load_balance_loss_weight * double(E) * lb;
  const double wz = cfg.router_z_loss_weight;
  if (g.lse_overflow)  // a token's lse^2 >= 2^86 or the sum >= 2^87 (a weight of 0 keeps 0)
    out.z_loss_f64 = wz == 0.0 ? 0.0 : wz * std::numeric_limits<double>::infinity();
  else
    out.z_loss_f64 = wz * from_fixed(g.lse_sq_sum, kLseUnit) / T;
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
  std::vector<Real> dp(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    dp[size_t(e)] = Real(wlb * double(E) * double(g.routed_counts[size_t(e)]) / (Tg * Tg));
  parallel_for(T, 64, [&](int64_t b, int64_t e_end) {  // a row of dlogits per token
    std::vector<Real> p(static_cast<size_t>(E));
    for (int64_t t = b; t < e_end; ++t) {
      Real lse = softmax_lse(logits.data<Real>() + t * E, p.data(), E);
      Real dot = Real(0);
      for (int64_t e = 0; e < E; ++e) dot += dp[size_t(e)] * p[size_t(e)];
      // d z-loss / d z[t, e] = wz * 2 * lse_t * p[t, e] / T.
      Real zc = Real(wz * 2.0 * double(lse) / Tg);
      Real* out = dlogits.data<Real>() + t * E;
      for (int64_t e = 0; e < E; ++e) out[e] += p[size_t(e)] * (dp[size_t(e)] - dot) + zc * p[size_t(e)];
    }
  });
}
}  // namespace

void aux_backward(const Config& cfg, const Tensor& logits, const AuxStats& g, Tensor& dlogits,
                  const AuxCotangents& s) {
  logits.dtype() == DType::f64 ? aux_backward_t<double>(cfg, logits, g, dlogits, s)
                               : aux_backward_t<float>(cfg, logits, g, dlogits, s);
}

}  // namespace moe
