// Wall-clock milliseconds for the training step's time split.
#pragma once

#include <chrono>

namespace moe::train {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace moe::train
