#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "moe/comm.h"
#include "moe/error.h"

namespace moe::cli {
namespace {

std::string clock_text(double seconds) {
  const long s = long(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

std::string bar_text(int64_t done, int64_t total, int width) {
  const int filled = total > 0 ? int(double(done) / double(total) * width) : width;
  return "[" + std::string(size_t(filled), '#') + std::string(size_t(width - filled), '.') + "]";
}

}  // namespace

ProgressMode parse_progress_mode(const std::string& text) {
  if (text == "bar") return ProgressMode::bar;
  if (text == "lines") return ProgressMode::lines;
  if (text == "none") return ProgressMode::none;
  if (text == "auto") return auto_progress_mode(this_progress_env());
  throw Error("--progress " + text + ": expected bar, lines, none or auto");
}

ProgressEnv this_progress_env() {
  ProgressEnv env;
  env.stdout_is_tty = ::isatty(STDOUT_FILENO) != 0;
  env.under_launcher = launched_by_mpi();
  for (const char* v : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID"})
    if (const char* s = std::getenv(v); s && *s) env.under_batch = true;
  if (const char* t = std::getenv("TERM")) env.term = t;
  return env;
}

ProgressMode auto_progress_mode(const ProgressEnv& env) {
  if (!env.stdout_is_tty || env.under_launcher || env.under_batch || env.term.empty() || env.term == "dumb")
    return ProgressMode::lines;
  return ProgressMode::bar;
}

void Progress::update(const StepMetrics& m) {
  ms_sum_ += m.step_ms;
  ++steps_seen_;
  const double eta_s = ms_sum_ / double(steps_seen_) * double(m.total_steps - m.step) * 1e-3;
  if (mode_ == ProgressMode::none) return;
  if (mode_ == ProgressMode::bar) {
    std::printf("\r%s %lld/%lld  loss %.4e  %.0f tok/s  ETA %s ", bar_text(m.step, m.total_steps, 30).c_str(),
                (long long)m.step, (long long)m.total_steps, m.loss, m.tokens_per_s,
                clock_text(eta_s).c_str());
    std::fflush(stdout);
    drawn_ = true;
    return;
  }
  if (m.step % log_period_ != 0 && m.step != m.total_steps && steps_seen_ != 1) return;
  std::printf("step %lld/%lld  loss %.6e  mse %.6e  lb %.4e  lr %.3e  grad_norm %.3e  %.0f tok/s  ETA %s\n",
              (long long)m.step, (long long)m.total_steps, m.loss, m.mse, m.lb, m.lr, m.grad_norm,
              m.tokens_per_s, clock_text(eta_s).c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (mode_ == ProgressMode::bar && drawn_) std::printf("\n");
  drawn_ = false;
}

}  // namespace moe::cli
