// `moe bench --scenario`: the layer the way a training loop uses it, to see
// what memory management costs when shapes change (docs/benchmarks.md, Real
// use). Three scenarios, each over one or more registry cases (fused variant):
//  - changing-t: `steps` fwd+bwd steps at the case's T, then `steps` steps whose
//    T is drawn every step from [0.75 T, 1.25 T] (a fresh input each step), then
//    a few steps at 1.25 T in a fresh process (the RSS baseline: --alone);
//  - sequential: the cases one after another in this process, each followed by
//    the same case alone in a fresh process (this program re-executed with --alone);
//  - accumulate: plain steps, then training steps that keep f32 gradient
//    accumulators over 2 micro-batches and apply an SGD update (both phases
//    with f32 master weights cast to the compute dtype every step).
// Every phase reports GFLOP/s, the system share of its CPU time (getrusage),
// minor faults per step, peak and current RSS, and the allocator's counters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/tensor.h"

namespace moe::bench {

struct RealUseOptions {
  std::string scenario;                // "changing-t" | "sequential" | "accumulate"
  std::vector<std::string> cases;      // default: many-experts (sequential: every bench case)
  std::vector<std::string> overrides;  // T=, D=, F=, E=, K= applied to every case
  DType dtype = DType::bf16;
  int steps = 20;  // timed steps per phase (>= 1)
  int warmup = 1;  // untimed steps before each phase (>= 0)
  uint64_t seed = 0;
  bool alone = false;    // this is one fresh-process run: the case's fixed-T steps only
  std::string self_exe;  // the program to re-execute (default /proc/self/exe)
};

// One phase of a scenario on one case.
struct RealUseRow {
  std::string scenario, phase,
      case_name;  // phase: fixed-t, changing-t, fixed-tmax, one-process, fresh-process, accumulate
  int64_t T_min = 0, T_max = 0, D = 0, F = 0, E = 0, K = 0;
  int steps = 0;
  double flops = 0;    // layer FLOPs of the timed steps
  double seconds = 0;  // their wall time
  double gflops = 0;   // flops / seconds
  double step_ms_median = 0;
  double user_s = 0, sys_s = 0;
  double sys_share = 0;  // sys_s / (user_s + sys_s)
  double minflt_per_step = 0;
  double peak_rss_mib = 0;  // VmHWM at the end of the phase (process-wide, monotone)
  double rss_mib = 0;       // VmRSS at the end of the phase
  uint64_t alloc_hits = 0, alloc_partial = 0, alloc_misses = 0, alloc_evictions = 0;  // during the phase
  double alloc_fresh_mib_per_step = 0;  // large-block bytes handed out that were not resident, per step
  double alloc_cached_mib = 0;          // at its end
};

// Targets (docs/benchmarks.md): changing-T >= 0.90 x fixed-T rate; system time
// < 5 % of CPU time; peak RSS after the changing steps <= 1.15 x the fixed-T
// peak at the largest T drawn (1.25 T, a fresh process); one-process cases
// within 10 % of fresh processes.
struct RealUseSummary {
  std::string name;  // e.g. "changing_over_fixed_gflops"
  double value = 0;
  double target = 0;
  bool higher_is_better = true;
  bool info = false;  // printed for information, no target (met is null in the JSON)
  bool met() const { return higher_is_better ? value >= target : value <= target; }
};

struct RealUseReport {
  std::string scenario;
  std::string allocator;  // "engine (cap N MiB)" or "C library (MOE_ALLOC_CACHE_MIB=0)"
  std::vector<RealUseRow> rows;
  std::vector<RealUseSummary> summary;
};

// Throws moe::Error for an unknown scenario, case or override, or when a
// fresh-process child fails.
RealUseReport run_real_use(const RealUseOptions& opts);

std::string format_real_use(const RealUseReport& r);  // text table + summary lines
std::string real_use_json(const RealUseReport& r);

// VmRSS of this process (/proc/self/status) in MiB; 0 where unreadable.
double rss_mib();

}  // namespace moe::bench
