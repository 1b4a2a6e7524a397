#include "train/step.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/counter_rng.h"
#include "train/optimizer.h"
#include "train/timer.h"

namespace moe::train {
namespace {

constexpr uint64_t kDataStream = 0x64617461ull;  // "data"

bool flag(const std::vector<char>& mask, size_t i) { return mask.empty() || mask[i]; }

void sync_grads(const StepEnv& env, const std::vector<Param>& grads) {
  TraceScope scope(env.student.trace, "AR:grads", OpEngine::compute);
  for (size_t i = 0; i < grads.size(); ++i)
    if (flag(env.summed, i)) env.sync->sum(grads[i].tensor->data<float>(), grads[i].tensor->numel());
}

// sqrt of the global sum of squares: each rank adds the tensors it owns
// (one copy of every replicated element), then the ranks' sums are added.
double global_grad_norm(const StepEnv& env, const std::vector<Param>& grads) {
  std::vector<Param> owned;
  for (size_t i = 0; i < grads.size(); ++i)
    if (flag(env.norm_owner, i)) owned.push_back(grads[i]);
  double ss = sum_of_squares(owned);
  TraceScope scope(env.student.trace, "AR:grad_norm", OpEngine::compute);
  env.sync->sum(&ss, 1);
  return std::sqrt(ss);
}

// The MSE over the global element count (aux losses already use global statistics).
double global_mse(const Config& cfg, const StepEnv& env, const LossTerms& l, int64_t global_tokens) {
  double sums[1] = {l.mse_sum};
  TraceScope scope(env.student.trace, "AR:loss", OpEngine::compute);
  env.sync->sum(sums, 1);
  return sums[0] / (double(global_tokens) * double(cfg.emb_dim));
}

// Rows per expert and drops of every layer summed over ranks (the layer reports this rank's).
void fill_routing_metrics(const StepEnv& env, LossTerms& l, StepMetrics& m) {
  if (env.student.dist) {
    std::vector<double> packed;
    for (const LayerStats& s : l.layers) {
      packed.insert(packed.end(), s.rows.begin(), s.rows.end());
      packed.push_back(double(s.dropped));
    }
    env.sync->sum(packed.data(), int64_t(packed.size()));
    size_t at = 0;
    for (LayerStats& s : l.layers) {
      for (double& r : s.rows) r = packed[at++];
      s.dropped = int64_t(packed[at++]);
      set_load(s);
    }
  }
  for (const LayerStats& s : l.layers) {
    m.load_max.push_back(s.load_max);
    m.load_mean.push_back(s.load_mean);
    m.dropped += s.dropped;
  }
}

// "inf: mse 0.0213, lb 0.0101, z inf": which term is not finite (the aux losses are NaN when any
// token's router logits are not, on any rank; docs/reliability.md).
std::string loss_terms(const StepMetrics& m) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%g: mse %g, lb %g, z %g", m.loss, m.mse, m.lb, m.z);
  return buf;
}

void apply_adamw(const Config& cfg, TrainState& st, const std::vector<Param>& grads, double lr) {
  AdamWHyper h{lr, cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay};
  auto p = parameters(cfg, st.params), m = parameters(cfg, st.m), v = parameters(cfg, st.v);
  for (size_t i = 0; i < p.size(); ++i)
    adamw_update(p[i].tensor->data<float>(), grads[i].tensor->data<float>(), m[i].tensor->data<float>(),
                 v[i].tensor->data<float>(), p[i].tensor->numel(), st.step + 1, h, p[i].decay);
}

}  // namespace

Tensor batch_inputs(const Config& cfg, int64_t step, int64_t token_begin, int64_t token_end) {
  MOE_ASSERT(0 <= token_begin && token_begin <= token_end, "batch_inputs: bad token range");
  const int64_t D = cfg.emb_dim;
  Tensor x = Tensor::empty(DType::f32, {token_end - token_begin, D});
  fill_normal(x, stream_key(uint64_t(cfg.seed), kDataStream, uint64_t(step)), 1.0f,
              uint64_t(token_begin * D));
  return x;
}

StepMetrics train_step(const Config& cfg, TrainState& st, const Model& teacher, const Tensor& x,
                       int64_t global_tokens, GradientSync& sync, PhaseTimes& times) {
  StepEnv env;
  env.sync = &sync;
  return train_step(cfg, st, teacher, x, global_tokens, env, times);
}

StepMetrics train_step(const Config& cfg, TrainState& st, const Model& teacher, const Tensor& x,
                       int64_t global_tokens, const StepEnv& env, PhaseTimes& times) {
  auto t0 = Clock::now();
  const Tensor target = model_forward(cfg, teacher, x, env.teacher);
  times.teacher += ms_since(t0);
  Model grads = zeros_like(cfg, st.params);
  LossTerms l = loss_and_grads(cfg, st.params, x, target, global_tokens, grads, times, env.student);
  auto t1 = Clock::now();
  std::vector<Param> g = parameters(cfg, grads);
  sync_grads(env, g);
  StepMetrics m;
  m.step = st.step + 1;
  m.mse = global_mse(cfg, env, l, global_tokens);
  m.lb = l.lb;
  m.z = l.z;
  m.loss = m.mse + m.lb + m.z;
  m.grad_norm = global_grad_norm(env, g);
  m.tokens = global_tokens;
  fill_routing_metrics(env, l, m);
  if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm))
    throw NonFiniteError("non-finite " + std::string(std::isfinite(m.loss) ? "gradient norm" : "loss") +
                         " (" + (std::isfinite(m.loss) ? std::to_string(m.grad_norm) : loss_terms(m)) +
                         ") at step " + std::to_string(m.step));
  if (cfg.grad_clip > 0 && m.grad_norm > cfg.grad_clip) scale_grads(g, float(cfg.grad_clip / m.grad_norm));
  m.lr = learning_rate_at(cfg, st.step);
  apply_adamw(cfg, st, g, m.lr);
  st.step += 1;
  m.collective_bytes = env.sync->bytes_moved();
  times.optimizer += ms_since(t1);
  return m;
}

TrainState fresh_state(const Config& cfg) {
  TrainState st;
  st.params = init_model(cfg, uint64_t(cfg.seed));
  st.m = zeros_like(cfg, st.params);
  st.v = zeros_like(cfg, st.params);
  return st;
}

}  // namespace moe::train
