#include "progress.h"

#include <cstdio>
#include <string>

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

void Progress::update(const StepMetrics& m) {
  ms_sum_ += m.step_ms;
  ++steps_seen_;
  const double eta_s = ms_sum_ / double(steps_seen_) * double(m.total_steps - m.step) * 1e-3;
  if (tty_) {
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
  if (tty_ && drawn_) std::printf("\n");
  drawn_ = false;
}

}  // namespace moe::cli
