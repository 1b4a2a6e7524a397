// The training loop: resume or start, step, record metrics, checkpoint,
// summarize (include/moe/train.h).
#include <algorithm>
#include <chrono>

#include "moe/train.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;
using train::TrainState;

// Running totals over the steps of this invocation.
struct RunTotals {
  train::PhaseTimes times;
  double balance_sum = 0;
  int64_t balance_count = 0;
  int64_t tokens = 0;
};

class Run {
 public:
  Run(const Config& cfg, const TrainOptions& opt) : cfg_(cfg), opt_(opt) {
    if (cfg.weight_dtype != DType::f32)
      fail("weight_dtype=", dtype_name(cfg.weight_dtype),
           ": moe train keeps f32 master weights (set weight_dtype: f32)");
    ckpt_dir_ = cfg.checkpoint_dir.empty() ? opt.resume_dir : cfg.checkpoint_dir;
    st_ = opt.resume_dir.empty() ? train::fresh_state(cfg) : train::load_checkpoint(opt.resume_dir, cfg);
    if (!opt.resume_dir.empty()) {
      saved_step_ = st_.step;
      say("resumed from " + opt.resume_dir + " at step " + std::to_string(st_.step));
    }
    teacher_ = train::init_model(cfg, uint64_t(cfg.teacher_seed));
    end_ = opt.stop_at < 0 ? cfg.steps : std::min(opt.stop_at, cfg.steps);
  }

  TrainSummary run() {
    train::MetricsWriter metrics(cfg_.metrics_file, st_.step);
    TrainSummary s;
    s.first_step = st_.step + 1;
    if (st_.step >= end_)
      say("already at step " + std::to_string(st_.step) + " of " + std::to_string(end_) + ": nothing to do");
    auto t0 = Clock::now();
    while (st_.step < end_) {
      StepMetrics m = one_step();
      if (m.step == s.first_step) s.first_loss = m.loss;
      s.last_loss = m.loss;
      metrics.write(m);
      if (opt_.on_step) opt_.on_step(m);
      if (!ckpt_dir_.empty() && cfg_.checkpoint_period > 0 && st_.step % cfg_.checkpoint_period == 0)
        checkpoint();
    }
    s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!ckpt_dir_.empty() && saved_step_ != st_.step && st_.step > 0) checkpoint();
    s.last_step = st_.step;
    finish(s);
    return s;
  }

 private:
  StepMetrics one_step() {
    auto t0 = Clock::now();
    train::PhaseTimes& tm = totals_.times;
    Tensor x = train::batch_inputs(cfg_, st_.step, 0, cfg_.batch_tokens);
    tm.data += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    StepMetrics m;
    try {
      m = train::train_step(cfg_, st_, teacher_, x, cfg_.batch_tokens, sync_, tm);
    } catch (const NonFiniteError& e) {
      throw NonFiniteError(
          std::string(e.what()) + "; training stopped, " +
          (last_ckpt_.empty() ? "no checkpoint was written" : "last good checkpoint: " + last_ckpt_));
    }
    m.total_steps = cfg_.steps;
    m.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    tm.total += m.step_ms;
    m.tokens_per_s = double(cfg_.batch_tokens) / (m.step_ms * 1e-3);
    for (size_t i = 0; i < m.load_max.size(); ++i, ++totals_.balance_count)
      totals_.balance_sum += m.load_mean[i] > 0 ? m.load_max[i] / m.load_mean[i] : 0.0;
    totals_.tokens += cfg_.batch_tokens;
    return m;
  }

  // Saves st_ unless a parameter is not finite (then stops: never write a bad checkpoint).
  void checkpoint() {
    if (!train::all_finite(train::parameters(cfg_, st_.params)))
      throw NonFiniteError(
          "non-finite parameters after step " + std::to_string(st_.step) + "; training stopped, " +
          (last_ckpt_.empty() ? "no checkpoint was written" : "last good checkpoint: " + last_ckpt_));
    last_ckpt_ = train::save_checkpoint(ckpt_dir_, cfg_, st_);
    saved_step_ = st_.step;
    say("checkpoint " + last_ckpt_);
  }

  void finish(TrainSummary& s) const {
    const train::PhaseTimes& t = totals_.times;
    s.tokens_per_s = s.seconds > 0 ? double(totals_.tokens) / s.seconds : 0;
    s.gflops = s.seconds > 0
                   ? train_step_flops(cfg_) * double(s.last_step - s.first_step + 1) / s.seconds * 1e-9
                   : 0;
    s.ms_data = t.data, s.ms_teacher = t.teacher, s.ms_norm = t.norm;
    s.ms_moe_forward = t.moe_forward, s.ms_moe_backward = t.moe_backward, s.ms_optimizer = t.optimizer;
    s.ms_other =
        std::max(0.0, t.total - (t.data + t.teacher + t.norm + t.moe_forward + t.moe_backward + t.optimizer));
    s.load_balance = totals_.balance_count ? totals_.balance_sum / double(totals_.balance_count) : 0;
    s.last_checkpoint = last_ckpt_;
  }

  void say(const std::string& line) const {
    if (opt_.log) opt_.log(line);
  }

  const Config& cfg_;
  const TrainOptions& opt_;
  std::string ckpt_dir_, last_ckpt_;
  TrainState st_;
  train::Model teacher_;
  train::LocalSync sync_;  // the seam for the distributed all-reduce
  RunTotals totals_;
  int64_t end_ = 0, saved_step_ = -1;
};

}  // namespace

double train_step_flops(const Config& cfg) {
  const double T = double(cfg.batch_tokens), R = T * double(cfg.num_experts_per_tok);
  const double D = double(cfg.emb_dim), F = double(cfg.moe_mlp_dim), E = double(cfg.num_experts);
  const double forward = 6 * R * D * F + 2 * T * D * E;
  return double(cfg.num_layers) * forward * (3 + 1);  // student fwd+bwd, teacher fwd
}

TrainSummary run_training(const Config& cfg, const TrainOptions& opt) { return Run(cfg, opt).run(); }

}  // namespace moe
