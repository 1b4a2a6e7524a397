// The training loop: resume or start, step, record metrics, checkpoint,
// summarize (include/moe/train.h). One process or, with TrainOptions::comm,
// the distributed layer (src/train/placement.h).
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "bench/dense_baseline.h"
#include "moe/memory_estimate.h"
#include "moe/train.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/placement.h"
#include "train/step.h"
#include "train/time_split.h"
#include "train/timer.h"

namespace moe {
namespace {

using train::Clock;
using train::ms_since;
using train::TrainState;

// Running totals over the steps of this invocation.
struct RunTotals {
  train::PhaseTimes times;
  train::TimeSplit split;
  double balance_sum = 0;
  int64_t balance_count = 0;
  int64_t tokens = 0;
  int64_t peak_bytes = 0;  // the largest live tensor bytes during a step
};

class Run {
 public:
  Run(const Config& cfg, const TrainOptions& opt) : cfg_(cfg), opt_(opt), place_(cfg, opt.comm) {
    if (cfg.weight_dtype != DType::f32)
      fail("weight_dtype=", dtype_name(cfg.weight_dtype),
           ": moe train keeps f32 master weights (set weight_dtype: f32)");
    ckpt_dir_ = cfg.checkpoint_dir.empty() ? opt.resume_dir : cfg.checkpoint_dir;
    st_ = opt.resume_dir.empty() ? place_.shard(train::fresh_state(cfg)) : resumed_state();
    if (root() && !ckpt_dir_.empty()) prepare_checkpoint_dir();
    if (!opt.resume_dir.empty()) {
      saved_step_ = st_.step;
      resumed_ckpt_ =
          (std::filesystem::path(opt.resume_dir) / train::checkpoint_file_name(st_.step)).string();
      say("resumed from " + opt.resume_dir + " at step " + std::to_string(st_.step));
    }
    teacher_ = place_.shard(train::init_model(cfg, uint64_t(cfg.teacher_seed)));
    end_ = opt.stop_at < 0 ? cfg.steps : std::min(opt.stop_at, cfg.steps);
  }

  TrainSummary run() {
    train::MetricsWriter metrics(root() ? cfg_.metrics_file : std::string(), st_.step);
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
      if (opt_.on_step && root()) opt_.on_step(m);
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
  bool root() const { return place_.rank() == 0; }

  // Rank 0 reads the checkpoint (its errors abort the job), the others get it by broadcast.
  TrainState resumed_state() const {
    return place_.from_root(root() ? train::load_checkpoint(opt_.resume_dir, cfg_)
                                   : train::fresh_state(cfg_));
  }

  StepMetrics one_step() {
    auto t0 = Clock::now();
    train::PhaseTimes& tm = totals_.times;
    if (CommCounters* c = place_.counters()) c->reset();
    place_.trace().restart();
    reset_tensor_memory_peak();
    const auto [row0, row1] = place_.rows();
    Tensor x = train::batch_inputs(cfg_, st_.step, row0, row1);
    tm.data += ms_since(t0);
    StepMetrics m;
    try {
      m = train::train_step(cfg_, st_, teacher_, x, cfg_.batch_tokens, place_.env(), tm);
    } catch (const NonFiniteError& e) {
      throw NonFiniteError(std::string(e.what()) + "; training stopped, " + last_good());
    }
    if (CommCounters* c = place_.counters()) m.side_ops = c->get(CollKind::SO).count;
    train::add_time_split(place_.trace().ops(), totals_.split);
    m.total_steps = cfg_.steps;
    m.step_ms = ms_since(t0);
    tm.total += m.step_ms;
    m.tokens_per_s = double(cfg_.batch_tokens) / (m.step_ms * 1e-3);
    for (size_t i = 0; i < m.load_max.size(); ++i, ++totals_.balance_count)
      totals_.balance_sum += m.load_mean[i] > 0 ? m.load_max[i] / m.load_mean[i] : 0.0;
    totals_.tokens += cfg_.batch_tokens;
    totals_.peak_bytes = std::max(totals_.peak_bytes, tensor_memory_stats().peak_bytes);
    return m;
  }

  std::string last_good() const {
    const std::string& good = last_ckpt_.empty() ? resumed_ckpt_ : last_ckpt_;
    return good.empty() ? "no checkpoint was written" : "last good checkpoint: " + good;
  }

  // Before the first step: a bad checkpoint_dir fails now, not after the
  // steps it would have saved; a killed run's temporary files go.
  void prepare_checkpoint_dir() const {
    if (int n = train::prepare_checkpoint_dir(ckpt_dir_))
      say("removed " + std::to_string(n) + " stale temporary file(s) from " + ckpt_dir_);
  }

  // Saves st_ unless a parameter is not finite on some rank (then stops:
  // never write a bad checkpoint). Rank 0 writes whole tensors.
  void checkpoint() {
    if (!place_.all_ranks(train::all_finite(train::parameters(cfg_, st_.params))))
      throw NonFiniteError("non-finite parameters after step " + std::to_string(st_.step) +
                           "; training stopped, " + last_good());
    TrainState whole = place_.to_root(st_);
    if (root()) train::save_checkpoint(ckpt_dir_, cfg_, whole);
    last_ckpt_ = (std::filesystem::path(ckpt_dir_) / train::checkpoint_file_name(st_.step)).string();
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
    const train::TimeSplit& sp = totals_.split;
    s.ms_gemm = sp.gemm, s.ms_permute_combine = sp.permute_combine, s.ms_router = sp.router;
    s.ms_exposed_comm = sp.exposed_comm, s.ms_rest = std::max(0.0, t.total - sp.sum());
    s.load_balance = totals_.balance_count ? totals_.balance_sum / double(totals_.balance_count) : 0;
    s.last_checkpoint = last_ckpt_;
    s.ranks = place_.size();
    const StepMinimum mem = train_step_minimum(cfg_, tokens_per_rank(cfg_, place_.size()), place_.size());
    s.step_peak_mib = double(totals_.peak_bytes) / (1024.0 * 1024.0);
    s.step_minimum_mib = double(mem.total() / (1024.0L * 1024.0L));
    s.step_minimum_terms = mem.describe();
    if (opt_.measure_dense && s.last_step >= s.first_step) measure_dense(s);
  }

  // The dense GEMM peak of one rank's expert-GEMM shape [R_l, D] x [D, 3F]:
  // the best of 5 medians (a CPU quota can stall a single short measurement).
  void measure_dense(TrainSummary& s) const {
    const int64_t rows = cfg_.batch_tokens / place_.size() * cfg_.num_experts_per_tok;
    for (int i = 0; i < 5; ++i) {
      DenseRate d = dense_matmul_rate(rows, cfg_.emb_dim, 3 * cfg_.moe_mlp_dim, cfg_.dtype, 10);
      s.dense_gflops = std::max(s.dense_gflops, d.gflops);
      s.dense_baseline = dense_baseline_name(d.baseline) + " (" + d.baseline.why + ")";
    }
    if (s.dense_gflops > 0) s.fraction_of_dense = s.gflops / double(s.ranks) / s.dense_gflops;
  }

  void say(const std::string& line) const {
    if (opt_.log && root()) opt_.log(line);
  }

  const Config& cfg_;
  const TrainOptions& opt_;
  train::Placement place_;
  std::string ckpt_dir_, last_ckpt_, resumed_ckpt_;  // resumed_ckpt_: the checkpoint --resume read
  TrainState st_;
  train::Model teacher_;
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
