#include "train/optimizer.h"

#include <cmath>

#include "kernels/dispatch.h"
#include "moe/thread_pool.h"

namespace moe::train {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, const AdamWHyper& h,
                  bool decay) {
  MOE_ASSERT(t >= 1, "adamw_update: t is 1-based");
  const float b1 = float(h.beta1), a1 = float(1.0 - h.beta1), b2 = float(h.beta2), a2 = float(1.0 - h.beta2);
  const float c1 = float(1.0 / (1.0 - std::pow(h.beta1, double(t))));
  const float c2 = float(1.0 / (1.0 - std::pow(h.beta2, double(t))));
  const float lr = float(h.lr), eps = float(h.eps), wd = decay ? float(h.lr * h.weight_decay) : 0.0f;
  // Element-wise: the active kernel level's vector loop (the same bits at every level and for
  // any split of the elements over the compute pool).
  const kernels::AdamWStep k{b1, a1, b2, a2, c1, c2, lr, eps, wd};
  const auto update = kernels::table().adamw;
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) { update(p + b, g + b, m + b, v + b, e - b, k); });
}

double learning_rate_at(const Config& cfg, int64_t step) {
  const double lr = cfg.learning_rate;
  if (step < cfg.warmup_steps) return lr * double(step + 1) / double(cfg.warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, cfg.steps - cfg.warmup_steps);
  const double progress = std::min(1.0, double(step - cfg.warmup_steps) / double(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine);
}

double sum_of_squares(const std::vector<Param>& grads) {
  double ss = 0;
  for (const Param& g : grads) {
    const float* p = g.tensor->data<float>();
    for (int64_t i = 0; i < g.tensor->numel(); ++i) ss += double(p[i]) * p[i];
  }
  return ss;
}

double global_norm(const std::vector<Param>& grads) { return std::sqrt(sum_of_squares(grads)); }

void scale_grads(const std::vector<Param>& grads, float factor) {
  for (const Param& g : grads) {
    float* p = g.tensor->data<float>();
    for (int64_t i = 0; i < g.tensor->numel(); ++i) p[i] *= factor;
  }
}

bool all_finite(const std::vector<Param>& ts) {
  for (const Param& t : ts) {
    const float* p = t.tensor->data<float>();
    for (int64_t i = 0; i < t.tensor->numel(); ++i)
      if (!std::isfinite(p[i])) return false;
  }
  return true;
}

}  // namespace moe::train
