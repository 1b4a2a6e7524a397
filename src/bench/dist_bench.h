// `moe bench --dist` (docs/benchmarks.md, "Distributed"): the seed's table
// for the distributed layer. Each variant is a mesh and a feature set (offload
// targets, token chunks, ring of experts) run on world ranks [0, ranks) under
// mpirun; per step: barrier, reset the collective counters and the step
// trace, forward + backward, then the step time, the exposed communication
// and compute time from the trace (split_compute_time, include/moe/trace.h)
// and the counters, each the max over the variant's ranks.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moe/comm.h"
#include "moe/config.h"

namespace moe::bench {

struct DistVariant {
  std::string name;
  int data = 1, fsdp = 1, expert = 1;  // mesh; ranks = the product
  void (*tweak)(Config&) = nullptr;    // features on top of the base config
  std::string baseline;                // variant it is compared with ("" = a baseline)
  std::string what;                    // one line for --list and docs
  int ranks() const { return data * fsdp * expert; }
};

// The registry, baselines before the variants compared with them.
const std::vector<DistVariant>& dist_variants();
// The named variants (all when empty) in registry order, each preceded by its
// baseline. An unknown name is an error listing the known ones.
std::vector<DistVariant> select_dist_variants(const std::vector<std::string>& names);
Config dist_variant_config(const Config& base, const DistVariant& v);

// The layer of the table: Mixtral-like, scaled for a small CPU (D=1024,
// F=512, E=8, K=2, bf16), then `key=value` overrides (validated).
Config dist_bench_config(const std::vector<std::string>& overrides);

struct DistBenchOptions {
  Config base;
  int64_t tokens = 256;  // per rank
  int iters = 5, warmup = 1;
  uint64_t seed = 0;
  std::vector<std::string> variants;  // empty: every variant
  std::string trace_dir;  // non-empty: the last timed step's trace of each variant, DIR/<variant>.json
  int speed_probe_iters = 0;  // > 0: SpeedProbe::run_ms with this many steps before and after each variant
};

struct DistResult {
  std::string variant, baseline;
  std::string skipped;  // why it did not run ("" when it ran)
  int ranks = 0, iters = 0;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  bool has_baseline = false;  // vs_baseline_pct is set
  double vs_baseline_pct = 0;
  double exposed_comm_ms = 0, compute_ms = 0;  // medians over the timed steps
  std::array<int64_t, kNumCollKinds> counts{}, bytes{};  // per step, max over ranks
  double probe_before_ms = 0, probe_after_ms = 0;         // SpeedProbe::run_ms on its ranks; 0: not run
};

// The machine's speed as the variants' ranks meet it, for `moe plan`'s validation (ModelOptions::
// probe_ms): a fixed one-rank layer (the table's layer with no overrides, 256 tokens, seed 1; the
// tokens of `rank`), built once. run_ms: every rank of `comm` at once (a barrier before each step),
// one compute-pool thread each, steps its forward + backward `iters` times after one untimed step,
// and returns the median over the steps of the slowest rank's time, ms, on every rank. Collective
// over `comm`; the pool's size is restored. `moe plan --calibrate` runs the same probe
// (Rates::probe_ms).
class SpeedProbe {
 public:
  explicit SpeedProbe(int rank);
  ~SpeedProbe();
  double run_ms(Communicator& comm, int iters);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Each step's time on its slowest rank: `mine` (this rank's times, the same count on every rank)
// gathered over `comm` (collective), the max per step.
std::vector<double> slowest_per_step(Communicator& comm, const std::vector<double>& mine);

// Collective over `world`. Results (complete on world rank 0 only) in run
// order; `on_result` is called on rank 0 as each is ready.
std::vector<DistResult> run_dist_bench(const DistBenchOptions& o, Communicator& world,
                                       const std::function<void(const DistResult&)>& on_result = {});

// Times `calls` all-to-alls moving `bytes` per rank in all (bytes/(W*calls)
// to each rank per call) over `world`, `iters` times after one untimed run:
// the communication of a step alone (bytes and calls as its A2A counters).
// bytes_out: what leaves each rank; mbit_per_s: bytes_out over the median time.
// median_ms: with MPI's own (spinning) waits, the fastest the link moves the
// bytes. A second pass waits politely (poll + sleep, as the side engine does):
// polite_median_ms, and busy_core_ms = the busy time of all cores per
// iteration from /proc/stat (the whole machine: every rank and the kernel's
// network work; -1 where /proc/stat cannot be read), i.e. what moving the
// bytes costs the CPUs when nobody spins.
struct ProbeResult {
  double median_ms = 0, mbit_per_s = 0, polite_median_ms = 0, busy_core_ms = -1;
  int64_t bytes_out = 0;
};
ProbeResult probe_all_to_all(Communicator& world, int64_t bytes, int iters, int calls = 1);
// The same for the pairwise traffic of a 2-rank group's all-gather (an FSDP pair's gather, one
// stream each way per pair), every pair at once: ranks 2i and 2i+1 exchange `bytes` each (in
// `calls` all-gathers); bytes_out = bytes. Needs an even number of ranks.
ProbeResult probe_pairs(Communicator& world, int64_t bytes, int iters, int calls = 1);

// dist_report.cpp: a text table, and {"dist_results": [...]} (skipped
// variants go to "skipped": [{"variant", "why"}]).
std::string format_dist_header();
std::string format_dist_row(const DistResult& r);
std::string dist_results_json(const std::vector<DistResult>& results);

}  // namespace moe::bench
