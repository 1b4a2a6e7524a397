// Training progress on stdout, in one of three modes (`moe train --progress`):
// a bar redrawn in place (step/total, loss, tokens/s, ETA), plain log lines
// every log_period steps (and the first and last), or nothing per step.
// `auto` picks the bar only for an interactive terminal that is nobody's log:
// under a launcher (mpirun, srun) each rank's stdout may be a pseudo-terminal
// that the launcher copies into the job's log file, so isatty() alone cannot
// be trusted there (docs/training.md, "Progress, metrics, summary").
#pragma once

#include <cstdint>
#include <string>

#include "moe/train.h"

namespace moe::cli {

enum class ProgressMode { bar, lines, none };

// "bar" | "lines" | "none" | "auto"; anything else is a moe::Error naming
// --progress and the choices.
ProgressMode parse_progress_mode(const std::string& text);

// What `auto` means for this process: lines under an MPI launcher or a batch
// system (SLURM_JOB_ID, PBS_JOBID, LSB_JOBID, JOB_ID set), on a dumb terminal
// (TERM unset or "dumb") or when stdout is not a terminal; else the bar.
// The inputs are passed in so the rule can be tested without a terminal.
struct ProgressEnv {
  bool stdout_is_tty = false;
  bool under_launcher = false;  // moe::launched_by_mpi()
  bool under_batch = false;     // a batch system's job id is set
  std::string term;             // $TERM
};
ProgressEnv this_progress_env();
ProgressMode auto_progress_mode(const ProgressEnv& env);

class Progress {
 public:
  Progress(ProgressMode mode, int64_t log_period) : mode_(mode), log_period_(log_period) {}
  void update(const StepMetrics& m);
  // Ends the bar's line so later output starts on a fresh line.
  void finish();

 private:
  ProgressMode mode_;
  int64_t log_period_;
  bool drawn_ = false;
  double ms_sum_ = 0;  // step times so far, for the ETA
  int64_t steps_seen_ = 0;
};

}  // namespace moe::cli
