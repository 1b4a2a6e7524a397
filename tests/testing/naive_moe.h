// An independent, naive f64 formulation of the MoE layer (MaxText's
// MoeLoopBlock): for each token, for each chosen expert, run that expert's
// gated MLP and add weight x output. No sorting, no grouping, no permutation.
// Tests compare the engine against it and take finite differences of it.
#pragma once

#include <vector>

#include "moe/config.h"
#include "moe/layer.h"

namespace moe::testing {

struct NaiveParams {
  std::vector<double> router;   // [D, E]
  std::vector<double> wi0, wi1;  // [E, D, F] (from wi_0/wi_1 or the halves of prefused wi)
  std::vector<double> wo;       // [E, F, D]
  std::vector<double> x;        // [T, D]
};

NaiveParams naive_params(const Config& cfg, const LayerWeights& w, const Tensor& x);

struct NaiveResult {
  std::vector<double> y;    // [T, D]
  std::vector<int> idx;     // [T, K]
  std::vector<double> w;    // [T, K]
  double lb = 0, zl = 0;
  double loss = 0;          // sum(y * dy) + lb + zl
};

// forced: optional [T*K] expert ids.
NaiveResult naive_forward(const Config& cfg, const NaiveParams& p, int64_t T, const std::vector<double>& dy,
                          const std::vector<int>* forced = nullptr);

}  // namespace moe::testing
