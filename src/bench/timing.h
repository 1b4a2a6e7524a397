// Wall-clock timing helpers for the bench harness.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace moe::bench {

inline double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Median (mean of the two middle values for an even count), min and max.
inline Timing summarize(std::vector<double> ms) {
  if (ms.empty()) return {};
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return {median, ms.front(), ms.back()};
}

// Runs fn once untimed, then `iters` timed runs.
inline Timing time_runs(int iters, const std::function<void()>& fn) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    double t0 = now_ms();
    fn();
    ms.push_back(now_ms() - t0);
  }
  return summarize(std::move(ms));
}

}  // namespace moe::bench
