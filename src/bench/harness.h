// `moe bench`: for each case and variant of the registry, check the variant
// bit for bit against its baseline, then time forward and forward+backward
// passes of the layer, next to a dense GEMM baseline and the permute/combine
// kernels' bandwidth against memcpy, all measured in the same run.
// docs/benchmarks.md describes every field.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/dense_baseline.h"
#include "moe/memory_estimate.h"

namespace moe::bench {

struct BenchOptions {
  std::vector<std::string> cases;  // empty: bench_cases()
  DType dtype = DType::bf16;
  std::optional<DType> weight_dtype;  // stored weights; default: the compute dtype
  int iters = 5;                      // timed iterations per variant (>= 1)
  int warmup = 1;                     // untimed iterations after the check run (>= 0)
  uint64_t seed = 0;
  std::vector<std::string> overrides;  // T=, D=, F=, E=, K= applied to every case (with_shape_overrides)
};

// One row of the report: a (case, variant, dtype, pass) combination.
struct BenchResult {
  std::string case_name, variant, dtype;
  std::string pass;          // "fwd" | "fwd+bwd"
  std::string check;         // "PASS" | "FAIL" (vs the baseline variant) | "ref" (a baseline itself)
  std::string check_detail;  // what differed, when FAIL
  int64_t T = 0, D = 0, F = 0, E = 0, K = 0;
  int iters = 0;
  double flops = 0;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  double gflops = 0;             // flops / median time
  double dense_gflops = 0;       // dense GEMM baseline, timed beside this row's steps
  DenseBaseline dense;           // which baseline that was (dense_baseline.h)
  double fraction_of_dense = 0;  // gflops / dense_gflops
  double peak_rss_mib = 0;       // process VmHWM after the variant ran (monotone, process-wide)
  double peak_alloc_mib = 0;     // the pass's own peak live tensor bytes (above what was live before it)
  // The step's peak: the weights and the inputs it reads plus peak_alloc_mib (docs/benchmarks.md), and
  // for fwd+bwd the analytic minimum (step_minimum, include/moe/memory_estimate.h) term by term.
  double step_peak_mib = 0;
  StepMinimum minimum{};                      // fwd+bwd rows only (zero for fwd)
  double peak_over_minimum = 0;               // step_peak_mib / minimum (fwd+bwd rows)
  double permute_gbps = 0, combine_gbps = 0;  // the variant's permute / combine kernel alone
  double memcpy_gbps = 0;
  double permute_fraction_of_memcpy = 0, combine_fraction_of_memcpy = 0;
  // The variant's paired dense runs against the case's reference (slow_phase below): how many times
  // it was timed again, and whether the kept attempt was still in a slow phase (its fraction of dense
  // then overstates the layer; `note` says so).
  int retimed = 0;
  bool dense_slow_phase = false;
  std::string note;  // "" or one sentence for stderr
};

// A slow phase of a shared machine can slow the paired dense runs far more than the layer's steps
// (oneDNN splits its work statically over its OpenMP threads: with one core taken it runs at half
// rate, while the engine's pool hands out chunks dynamically; docs/benchmarks.md, "Paired with the
// dense baseline"). A case's reference is the median of the dense runs timed at its start, lowered
// to any faster median a variant's pairs reach; a variant whose paired dense median is more than
// kSlowPhase times the reference is timed again, up to kRetimes times, and keeps the attempt whose
// dense runs were fastest.
inline constexpr double kSlowPhase = 1.25;
inline constexpr int kRetimes = 2;
// True when the median of `dense_ms` is more than kSlowPhase x `reference_ms`.
bool slow_phase(const std::vector<double>& dense_ms, double reference_ms);

// Runs every selected case and variant. `on_result` is called as each row is
// ready (for live printing). Throws moe::Error for an unknown case name.
std::vector<BenchResult> run_bench(const BenchOptions& opts,
                                   const std::function<void(const BenchResult&)>& on_result = {});

// True when no row has check "FAIL".
bool all_checks_passed(const std::vector<BenchResult>& results);

// Report formats (report.cpp): an aligned text table (the setup line, the
// column header, one line per row), and the JSON of SPEC.md §7 with the setup
// beside the rows: {"isa", "isa_available", "dense_baseline", "results": [{...}, ...]}.
// The setup is the active kernel level's and the first row's dense baseline.
// "kernel level: avx2 (available: ...); dense baseline: oneDNN f32 matmul (why)\n"
std::string format_setup_line(const DenseBaseline& dense);
std::string format_table_header();
std::string format_table_row(const BenchResult& r);
std::string results_json(const std::vector<BenchResult>& results);

// VmHWM of this process in MiB (0 where /proc is unavailable).
double peak_rss_mib();

}  // namespace moe::bench
