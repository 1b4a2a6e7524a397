// Kernel rates of `moe plan`: what one rank's compute pool does per second at
// one thread, measured by `moe plan --calibrate` (calibrate.h) or given
// (`--rates FILE`). File format: docs/formats.md, "Plan rates".
#pragma once

#include <string>
#include <vector>

#include "moe/dtype.h"
#include "plan/cluster.h"

namespace moe::plan {

// The expert FFN's rates at one shape (GFLOP/s of the op's useful FLOPs, one thread).
struct GemmPoint {
  DType dtype = DType::bf16;
  int64_t D = 0, F = 0;
  double rows_per_expert = 0;
  double ffn_gflops = 0;           // forward: 6·R·D·F (3 GEMMs + activation)
  double ffn_backward_gflops = 0;  // input gradients: 6·R·D·F
  double weight_grads_gflops = 0;  // weight gradients: 6·R·D·F
  // The whole step at Rates::pool_threads over one thread at this point (the median step of each,
  // alternated); 0: not measured (Rates::pool_speedup stands in).
  double pool_speedup = 0;
  // Experts of the calibrated shape (0: not recorded, files before 2026-12-07): at the same rows per
  // expert, many experts read more weight bytes per FLOP, which the fast levels feel (ffn_at).
  int64_t experts = 0;
};

// What ranks sharing cores cost each collective (measured by `moe plan --calibrate` under
// `mpirun -np N`, one row per ranks-per-core; docs/distributed.md, "Model of scale"). A blocking
// collective completes when the last member arrives; the compute since the previous collective
// is stretched unevenly on shared cores (time slices, memory bandwidth), so the others wait
// wait_s(c) beyond the α–β cost (the mean over ranks: max − mean of the arrivals, what the step's
// critical path gains over the mean rank), c = the compute thread's seconds since its previous collective:
// linear between the measured points (compute_s[i], wait_s[i]), the last one beyond them.
// A polled side-engine collective waits up to side_busy_s longer while its rank's compute thread
// computes (its worker sleeps between polls and must get a core); less when the compute thread
// blocks earlier (then the worker runs at once). The ranks' compute itself runs compute_slowdown
// times slower than one rank alone at its share of the cores (memory bandwidth, caches, clocks).
// While a side op is in flight, its rank's compute runs side_cpu_frac of that time slower (the
// worker's polls, MPI's progress, the kernel's TCP work, on the cores the compute uses: measured
// as the compute's stretch over the op's span; 0 where the rank has a core to spare).
// ag_bw_Bps: the per-rank bandwidth of a large all-gather inside the host with this many ranks per
// core (the weight gathers, the gradients' all-reduce), measured; 0: not measured (the link's
// bandwidth times the rank's share of a core stands in).
// `moe plan --calibrate` of one process writes the row of one rank on the machine (no waits, 1).
struct Contention {
  double ranks_per_core = 0;
  std::vector<double> compute_s, wait_s;  // ascending compute_s
  double side_busy_s = 0;
  double compute_slowdown = 1;
  // compute_slowdown is measured with ranks that each hold the whole calibrated layer
  // (weight_bytes, expert_weight_bytes), and again with E / ranks experts each
  // (small_weight_bytes, small_compute_slowdown): smaller weights contend less for the caches and
  // memory. Between the two, linear in log(bytes); outside, the nearer one. 0 bytes: not measured
  // (compute_slowdown at any size).
  double weight_bytes = 0, small_weight_bytes = 0, small_compute_slowdown = 1;
  double slowdown_at(double weight_bytes) const;
  double side_cpu_frac = 0;  // in [0, 1]
  // While its worker waits in a side op whose peers have not all arrived (polling: its sleeps and
  // MPI_Test calls; a real-time worker preempts the compute at each), the rank's compute runs
  // side_wait_frac of that time slower: measured with the workers' scheduling policy of the run
  // (MOE_SIDE_ENGINE_RT), in [0, 3] (at 2 ranks per core both ranks' workers poll on a core).
  double side_wait_frac = 0;
  // Per rank, a large collective inside a host at this many ranks per core, measured (0: not):
  // an all-gather's ring β and an all-to-all's β (bytes leaving a rank over its time).
  double ag_bw_Bps = 0, a2a_bw_Bps = 0;
  // The engine's all-reduce (Communicator::all_reduce_sum) of a large f32 vector inside a host at
  // this many ranks per core, per rank: the vector's bytes over the call's time (0: not measured).
  // Over all `ar_ranks` ranks of the host, and over pairs of them at once (ar_pair_bw_Bps; the same
  // call where the host has 2 ranks).
  double ar_bw_Bps = 0, ar_pair_bw_Bps = 0;
  int ar_ranks = 0;
  double wait_after(double compute_s) const;
};

struct Rates {
  std::string machine;  // free text (CPU, date, load)
  std::string isa;
  int pool_threads = 1;     // threads of the speedup measurement
  double pool_speedup = 1;  // step time at 1 thread / at pool_threads
  std::vector<GemmPoint> gemm;
  double router_gflops = 0;           // 2·T·D·E (f32, + softmax/top-k)
  double router_backward_gflops = 0;  // 4·T·D·E (+ the aux losses' backward)
  double sort_ns_per_row = 0;         // routing index math per routed row (T·K)
  double permute_gbps = 0;            // 2·R·D·bytes (read x rows, write xs)
  double combine_gbps = 0;            // R·D·bytes + T·D·bytes
  double combine_backward_gbps = 0;   // 2·R·D·bytes
  double permute_backward_gbps = 0;   // R·D·bytes + T·D·4
  double memcpy_gbps = 0;             // row movement, casts, ordered sums (bytes read + written)
  Link intra;                         // shared memory between two ranks of this machine
  bool intra_measured = false;        // false: derived from memcpy_gbps and a default latency
  double side_op_overhead_us = 0;     // hand-off of one op to the side engine and back
  double comm_cpu_ns_per_byte = 0;    // host CPU per byte sent between hosts (TCP stack)
  // By ranks per core, ascending; none (a file from before them): no contention terms.
  std::vector<Contention> contention;
  // The speed probe (bench::SpeedProbe: one rank, one pool thread, a fixed forward + backward)
  // around the kernel rates of the single-process calibration, ms (the mean of before and after);
  // 0: not measured (a file from before it). A measurement that ran the same probe can be
  // predicted at the machine's speed during it (ModelOptions::probe_ms).
  double probe_ms = 0;

  // The point's GFLOP/s for (dtype, D, F, rows per expert): the nearest calibrated D·F of that
  // dtype (else any dtype), interpolated in log(rows per expert), clamped at the ends.
  GemmPoint ffn_at(DType dtype, int64_t D, int64_t F, double rows_per_expert, int64_t experts = 0) const;
  // Relative speed of a rank with `cores` cores running `threads` pool threads: cores below 1 are
  // time slices; above, each extra thread adds (speedup-1)/(pool_threads-1), speedup = `at`'s
  // pool_speedup where it was measured, else the file's pool_speedup.
  double speed(double cores, int threads, const GemmPoint* at = nullptr) const;
  // The collective's wait at `ranks_per_core` after `compute_s` of compute: linear in ranks per core
  // between the measured rows, from zero at 0 ranks per core up to the first, the last row beyond
  // the last; 0 when no row was measured. side_busy_at: the same for side_busy_s.
  double wait_at(double ranks_per_core, double compute_s) const;
  double side_busy_at(double ranks_per_core) const;
  double side_cpu_frac_at(double ranks_per_core) const;
  double side_wait_frac_at(double ranks_per_core) const;
  // 1 at 0 ranks per core; at the ranks' expert weight bytes (Contention::slowdown_at; 0: the whole
  // calibrated layer's).
  double compute_slowdown_at(double ranks_per_core, double weight_bytes = 0) const;
  // The measured all-gather bandwidth at `ranks_per_core`: linear between the rows that measured
  // it, the nearest such row beyond them; 0 when none did.
  double ag_bw_at(double ranks_per_core) const;
  double a2a_bw_at(double ranks_per_core) const;  // as ag_bw_at, from the rows that measured it
  // As ag_bw_at, the measured all-reduce bandwidth of a group of `ranks` ranks inside a host: from
  // the rows that measured a group of that size (the host's ranks, or pairs); 0 when none did, and
  // below the first such row where that row's ranks shared cores (more than 1 rank per core).
  double ar_bw_at(double ranks_per_core, int ranks) const;
  // Adds a measured row, replacing one at the same ranks per core; keeps the rows sorted.
  void set_contention(const Contention& c);
};

// JSON text of the file, and back. read_rates throws naming the file and the field.
std::string rates_json(const Rates& r);
Rates parse_rates(const std::string& text, const std::string& where);
Rates read_rates(const std::string& path);

}  // namespace moe::plan
