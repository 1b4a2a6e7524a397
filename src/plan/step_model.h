// The step model of `moe plan`: one forward + backward of the distributed
// layer (src/distributed/dist_forward.cpp, dist_backward.cpp) replayed on two
// timelines, the compute thread and the side engine (one FIFO worker), in the
// order StepExec issues the ops: every collective costed with collectives.h,
// every compute op with the rates (rates.h) at this rank's cores. Exposed
// communication = the compute thread's time in inline collectives and in
// waits for side-engine events, as `moe bench --dist` measures it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "moe/dtype.h"
#include "plan/cluster.h"
#include "plan/collectives.h"
#include "plan/rates.h"

namespace moe::plan {

// The layer per rank (letters of SPEC.md): T tokens per rank.
struct LayerShape {
  std::string name;
  int64_t T = 0, D = 0, F = 0, E = 0, K = 0;
  DType dtype = DType::bf16, weight_dtype = DType::f32;
  // The routing, when known (`moe plan --bench-variant`: plan/bench_rows.h): per chunk, the routed
  // rows of the busiest rank's experts, and the most rows one rank's experts get over the step.
  // A step goes at its slowest rank's pace (every collective waits for it), so the expert ops are
  // timed at these rows. Empty (or not one per chunk of the layout): uniform routing, T·K/chunks.
  std::vector<double> busiest_chunk_rows;
  double busiest_step_rows = 0;
};

struct Layout {
  int data = 1, fsdp = 1, expert = 1;
  int chunks = 1;
  bool ring = false;                                        // use_ring_of_experts
  bool off_fsdp = false, off_ep = false, off_sort = false;  // live offload targets
  A2AAlgo a2a = A2AAlgo::flat;
  int ranks() const { return data * fsdp * expert; }
  std::string offload_text() const;  // "" | "fsdp_all_gather,ep_collectives,..." ("all" when all three)
  std::string name() const;          // e.g. "d1 f2 e4 c4 ring +all a2a=hier"
};

// One op on a timeline (seconds since the step start).
struct SimOp {
  std::string name;
  bool side = false;
  bool comm = false;  // a collective (inline: exposed) or a wait for one
  double start = 0, end = 0;
};

struct Prediction {
  Layout layout;
  double step_s = 0;
  double compute_s = 0;                   // compute-thread time in compute ops
  double exposed_comm_s = 0;              // inline collectives + waits
  double comm_s = 0;                      // every collective's α–β cost, hidden or not
  double side_busy_s = 0;                 // side-engine busy time
  // The CPU seconds one rank keeps a core busy per step (its compute, the copies of its collectives
  // inside a host, the TCP stack's work for those between hosts), and, where ranks share cores, the
  // fraction of the step the other ranks on a core demand it (cpu_s / step_s at the fixed point
  // predict_step finds; 1 where each rank has a core or more).
  double cpu_s = 0;
  double others_busy = 1;
  double compute_cores = 1;  // the cores a rank's compute gets (core_share of cores_per_rank)
  std::map<std::string, double> terms;    // time by kind (router, ffn, A2A, AG:weights, ...), hidden or not
  std::map<std::string, double> exposed;  // exposed communication by kind (inline or waited for)
  std::vector<SimOp> ops;
};

struct ModelOptions {
  // Fraction of a side-engine op's CPU work that the compute thread loses when both share a
  // core: clamp(2 - cores per rank, 0, 1) unless set (>= 0).
  double steal = -1;
  // The speed probe's time during the measurement being predicted (bench::SpeedProbe: every
  // rank of the host at once, the slowest rank's median, ms); 0: none. When given, the ranks'
  // compute is scaled by how much slower (or faster) the probe ran than the calibration predicts
  // for it (compute_slowdown): the machine's speed as it was during that measurement (the
  // machine's cores change speed for minutes at a time, docs/distributed.md).
  double probe_ms = 0;
  // Where ranks share cores: the fraction of the step the other ranks on a core demand it
  // (Prediction::others_busy); -1: found by predict_step (its fixed point). 1: every rank computing
  // at once, the cores' time slices (the calibration's own condition).
  double others_busy = -1;
};

// Bytes of the expert weights a rank's compute touches per step with `experts` local experts: the
// stored weights (3·D·F each), and their cast copies when the compute dtype differs.
double expert_weight_bytes(const LayerShape& L, int64_t experts);

// The factor the ranks' compute runs slower than the calibrated rates on this cluster: the rates'
// compute slowdown at its ranks per core and the layout's expert weight bytes per rank (measured
// with every rank computing at once; its excess over 1 scaled by `others_busy`, the fraction of the
// time the other ranks compute); with a paired probe (ModelOptions::probe_ms; throws when the rates
// have no probe of their own) times the probe's time over what the calibration predicts for it
// (Rates::probe_ms x max(1, ranks per core) x the slowdown of the whole calibrated layer): the
// machine's speed during that measurement.
double compute_slowdown(const LayerShape& L, const Layout& lay, const Cluster& cl, const Rates& r,
                        const ModelOptions& o, double others_busy = 1);

// The cores a rank's compute gets where ranks_per_core > 1 ranks share each core and the others
// demand it a fraction u of the time (Prediction::others_busy): 1 / (1 + (ranks_per_core - 1) u),
// from a time slice (u = 1) to a whole core (u = 0): a rank that waits in a collective yields its
// core (mpi_yield_when_idle) to the one beside it. cores_per_rank itself where it is 1 or more.
double core_share(double cores_per_rank, double others_busy);

// The side-engine ops the compute thread has not waited for yet, in FIFO order: their spans on the
// worker and the CPU seconds of their own work.
struct SideSpan {
  double start = 0, end = 0, cpu = 0;
};
// The extra seconds of a compute op [t, t + dur) beside those ops (the model's compute stretch; the
// worker shares the rank's cores by `steal`): over each op's span, the op's CPU per second of span,
// or cpu_frac if more; with peers_late (ranks share cores, so peers arrive late by time slices),
// wait_frac if that is more still, and wait_frac of the rest of the time from the first op's start
// (the worker polls for its peers until the compute thread waits for the op). Where each rank has
// a core, its peers are on time, and cpu_frac, measured with the ops' own traffic, holds the polls.
double side_stretch(const std::vector<SideSpan>& pending, double t, double dur, double steal, double cpu_frac,
                    double wait_frac, bool peers_late);

// REQUIRES: layout.ranks() == cluster.ranks(); E % expert == 0; D % fsdp == 0 (check_layout says why not).
// Where ranks share cores (and ModelOptions::others_busy is -1), the step is simulated at
// others_busy = 1 (every rank computing at once: time slices), then again at the busy fraction that
// prediction gives, until it settles (each prediction's fraction is at most the one before, so the
// sequence falls to the largest fixed point).
Prediction predict_step(const LayerShape& L, const Layout& lay, const Cluster& cl, const Rates& r,
                        const ModelOptions& o = {});
// "" when the layout can run this layer on this cluster, else why not.
std::string check_layout(const LayerShape& L, const Layout& lay, const Cluster& cl);

}  // namespace moe::plan
