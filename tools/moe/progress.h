// Training progress on stdout: a bar redrawn in place on a terminal
// (step/total, loss, tokens/s, ETA), plain log lines every log_period steps
// otherwise (pipes, files, CI logs).
#pragma once

#include <cstdint>

#include "moe/train.h"

namespace moe::cli {

class Progress {
 public:
  // tty: redraw in place; else one line every log_period steps (and the last step).
  Progress(bool tty, int64_t log_period) : tty_(tty), log_period_(log_period) {}
  void update(const StepMetrics& m);
  // Ends the bar's line (tty) so later output starts on a fresh line.
  void finish();

 private:
  bool tty_;
  int64_t log_period_;
  bool drawn_ = false;
  double ms_sum_ = 0;  // step times so far, for the ETA
  int64_t steps_seen_ = 0;
};

}  // namespace moe::cli
