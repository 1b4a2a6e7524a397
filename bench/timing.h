// Median wall times of two workloads run alternately (one untimed warm-up
// call of each first), so a noisy shared machine slows both alike.
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace moe::bench {

template <class Fn>
double time_ms(const Fn& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The wall times of a and b, run alternately after one untimed call of each.
template <class A, class B>
std::pair<std::vector<double>, std::vector<double>> times_ms_interleaved(int reps, const A& a, const B& b) {
  a(), b();
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) ta.push_back(time_ms(a)), tb.push_back(time_ms(b));
  return {ta, tb};
}

// {median ms of a, median ms of b}.
template <class A, class B>
std::pair<double, double> median_ms_interleaved(int reps, const A& a, const B& b) {
  const auto [ta, tb] = times_ms_interleaved(reps, a, b);
  return {median(ta), median(tb)};
}

}  // namespace moe::bench
