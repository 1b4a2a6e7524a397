// AdamW with bias-corrected moments and decoupled weight decay, the
// learning-rate schedule, and global-norm gradient clipping.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/config.h"
#include "train/model.h"

namespace moe::train {

// Hyperparameters in double; the update derives its f32 coefficients from
// them (1 - beta computed in double, so 1 - 0.999 is not f32 cancellation).
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
};

// One AdamW update of n elements; t >= 1 is the update's 1-based count (bias
// correction); decay=false skips weight decay (norm scales). Per element:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr * wd * p   (wd only with decay)
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, const AdamWHyper& h,
                  bool decay);

// Learning rate of the update with 0-based index `step` (of cfg.steps):
// linear warm-up lr * (step+1) / warmup_steps for step < warmup_steps, then
// cosine decay from lr to min_lr_ratio * lr over the remaining steps.
double learning_rate_at(const Config& cfg, int64_t step);

// L2 norm over every element of every tensor (summed in double, in order).
double global_norm(const std::vector<Param>& grads);
// The squared norm global_norm takes the root of (same order, same bits).
double sum_of_squares(const std::vector<Param>& grads);

// Multiplies every gradient by `factor`.
void scale_grads(const std::vector<Param>& grads, float factor);

// True if every element of every tensor is finite.
bool all_finite(const std::vector<Param>& ts);

}  // namespace moe::train
