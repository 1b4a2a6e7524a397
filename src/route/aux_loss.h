// Auxiliary router losses (SPEC.md §2 step 2), already multiplied by their
// weights, and their gradient with respect to the logits.
#pragma once

#include <vector>

#include "moe/config.h"
#include "moe/layer.h"
#include "moe/tensor.h"

namespace moe {

struct AuxLosses {
  float load_balance = 0.0f;  // weight * E * sum_e (c_e / T) * P_e
  float z_loss = 0.0f;        // weight * mean_t logsumexp(z_t)^2
  // The same before the rounding to f32 (what the f64 path reports).
  double load_balance_f64 = 0.0, z_loss_f64 = 0.0;
};

// Token statistics behind the aux losses. Sums are kept in fixed point
// (__int128, probabilities in units of 2^-60, squared log-sum-exps in units
// of 2^-40) so adding per-rank statistics in any order gives the same bits as
// one process over all tokens: the distributed loss equals the single-process
// loss exactly. The quantization error (< T * 2^-60) is far below f32 ulp.
//
// Non-finite tokens (docs/reliability.md): a token whose logits are not all
// finite (NaN or inf in its x, in the router kernel, or an f32 overflow) is
// left out of the sums and counted in `nonfinite`; any count > 0, on any rank,
// makes both losses NaN. A squared log-sum-exp sum past the fixed-point range
// (2^127 units) sets `lse_overflow`: the z-loss is then +inf (weight > 0).
// Both are exact integers, so every grouping of the ranks gives the same result.
using FixedSum = __int128;
struct AuxStats {
  std::vector<FixedSum> prob_sum;      // [E] sum over finite tokens of softmax(z)[t, e]
  FixedSum lse_sq_sum = 0;             // sum over finite tokens of logsumexp(z_t)^2
  std::vector<int64_t> routed_counts;  // [E] slots routed to each expert, before dropping
  int64_t tokens = 0;                  // all tokens, finite or not
  int64_t nonfinite = 0;               // tokens with a non-finite logit
  int64_t lse_overflow = 0;            // 1: lse_sq_sum left the fixed-point range (value unusable)
  // Adds another shard's statistics (exact, order-independent).
  void add(const AuxStats& o);
};

// logits: [T, E] f32 (f64 on the double path: the softmax in double); routed_counts: [E].

AuxStats aux_stats(const Tensor& logits, const std::vector<int64_t>& routed_counts);
AuxLosses aux_losses(const Config& cfg, const AuxStats& global);

// dlogits [T, E] += d(s.load_balance * lb + s.z_loss * z_loss)/dlogits for the local tokens,
// using global statistics (s: the losses' cotangents, include/moe/layer.h).
void aux_backward(const Config& cfg, const Tensor& logits, const AuxStats& global, Tensor& dlogits,
                  const AuxCotangents& s = {});

}  // namespace moe
