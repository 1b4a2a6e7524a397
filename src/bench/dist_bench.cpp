// Runs the variants of `moe bench --dist` (src/bench/dist_bench.h).
#include "bench/dist_bench.h"
#include "distributed/mesh_variants.h"

#include <algorithm>
#include <memory>

#include "bench/cases.h"
#include "bench/timing.h"
#include "moe/dist_layer.h"
#include "io/atomic_file.h"
#include "moe/dist_runtime.h"
#include "moe/mesh.h"
#include "moe/thread_pool.h"
#include "moe/trace_gather.h"

namespace moe::bench {
namespace {

// What one rank needs to step a variant: with offload targets the runtime
// (mesh, side engine, trace); without, a plain mesh and a trace of its own
// (the path of a build without the feature).
struct Rig {
  std::unique_ptr<DistRuntime> rt;
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<StepTrace> own_trace;
  std::unique_ptr<DistLayer> layer;
  StepTrace* trace = nullptr;
  LayerWeights shards;
  Tensor x, dy;  // [T_l, D] this rank's tokens
};

void build_rig(Rig& rig, const Config& cfg, Communicator& comm, int64_t tokens, uint64_t seed) {
  if (!cfg.moe_offload_targets.empty()) {
    rig.rt = std::make_unique<DistRuntime>(cfg, comm, /*training=*/true);
    rig.rt->enable_trace(true);
    rig.trace = rig.rt->trace();
    rig.layer = std::make_unique<DistLayer>(cfg, *rig.rt);
  } else {
    rig.mesh = std::make_unique<Mesh>(comm, check_parallel_config(cfg, comm.size()));
    rig.own_trace = std::make_unique<StepTrace>(comm.rank());
    rig.trace = rig.own_trace.get();
    rig.layer = std::make_unique<DistLayer>(cfg, *rig.mesh, false, rig.trace);
  }
  rig.shards = rig.layer->shard(init_weights(cfg, seed));
  Case c;
  c.name = "dist", c.T = tokens, c.D = cfg.emb_dim, c.F = cfg.moe_mlp_dim, c.E = cfg.num_experts;
  c.K = cfg.num_experts_per_tok, c.seed = seed;
  CaseInputs in = case_inputs(c, uint64_t(comm.rank()) + 1);
  rig.x = in.x, rig.dy = in.dy;
}

// One rank's measurements of one step, as doubles for one gatherv.
enum Field { kStep, kExposed, kCompute, kCounts, kBytes = kCounts + kNumCollKinds, kFields = kBytes + kNumCollKinds };
using Sample = std::array<double, kFields>;

Sample step_once(Rig& rig, Communicator& comm) {
  comm.barrier();
  comm.counters().reset();
  rig.trace->restart();
  const double t0 = now_ms();
  LayerOutputs out;
  DistForwardPtr f = rig.layer->forward(rig.shards, rig.x, nullptr, out);
  LayerGrads g = rig.layer->backward(*f, rig.dy);
  Sample s{};
  s[kStep] = now_ms() - t0;
  const ComputeSplit split = split_compute_time(rig.trace->ops());
  s[kExposed] = double(split.exposed_comm_us) / 1e3;
  s[kCompute] = double(split.compute_us) / 1e3;
  for (int k = 0; k < kNumCollKinds; ++k) {
    s[size_t(kCounts + k)] = double(comm.counters().get(CollKind(k)).count);
    s[size_t(kBytes + k)] = double(comm.counters().get(CollKind(k)).bytes);
  }
  return s;
}

// Field-wise max over the ranks of `comm`, on its rank 0 (uncounted gatherv).
Sample max_over_ranks(Communicator& comm, const Sample& mine) {
  const int W = comm.size();
  std::vector<Sample> all(static_cast<size_t>(W));
  comm.gatherv(mine.data(), sizeof(Sample), all.data(), std::vector<size_t>(size_t(W), sizeof(Sample)), 0);
  Sample m = mine;
  if (comm.rank() == 0)
    for (const Sample& s : all)
      for (size_t i = 0; i < m.size(); ++i) m[i] = std::max(m[i], s[i]);
  return m;
}

// Chrome trace JSON of every member's ops of the last step, written by comm rank 0.
void write_trace(Communicator& comm, const StepTrace& trace, const std::string& path) {
  std::vector<TraceOp> ops = gather_trace_ops(comm, trace.ops());
  if (comm.rank() == 0) write_file_atomic(path, chrome_trace_json(ops));
}

double median_of(std::vector<Sample>& v, Field f) {
  std::vector<double> x;
  for (const Sample& s : v) x.push_back(s[size_t(f)]);
  return summarize(x).median_ms;
}

DistResult measure(const DistBenchOptions& o, const DistVariant& v, const Config& cfg, Communicator& comm,
                   SpeedProbe* probe) {
  DistResult r;
  if (probe) r.probe_before_ms = probe->run_ms(comm, o.speed_probe_iters);
  Rig rig;
  build_rig(rig, cfg, comm, o.tokens, o.seed);
  for (int i = 0; i < o.warmup; ++i) step_once(rig, comm);
  std::vector<Sample> steps;
  for (int i = 0; i < o.iters; ++i) steps.push_back(max_over_ranks(comm, step_once(rig, comm)));
  if (!o.trace_dir.empty()) write_trace(comm, *rig.trace, o.trace_dir + "/" + v.name + ".json");
  if (probe) r.probe_after_ms = probe->run_ms(comm, o.speed_probe_iters);
  r.variant = v.name, r.baseline = v.baseline, r.ranks = v.ranks(), r.iters = o.iters;
  std::vector<double> ms;
  for (const Sample& s : steps) ms.push_back(s[kStep]);
  const Timing t = summarize(ms);
  r.median_ms = t.median_ms, r.min_ms = t.min_ms, r.max_ms = t.max_ms;
  r.exposed_comm_ms = median_of(steps, kExposed);
  r.compute_ms = median_of(steps, kCompute);
  for (int k = 0; k < kNumCollKinds; ++k) {
    r.counts[size_t(k)] = int64_t(steps.back()[size_t(kCounts + k)]);
    r.bytes[size_t(k)] = int64_t(steps.back()[size_t(kBytes + k)]);
  }
  return r;
}

}  // namespace

struct SpeedProbe::State {
  Config cfg = dist_bench_config({});
  std::unique_ptr<Communicator> self = make_single_process_comm();
  Mesh mesh{*self, MeshShape{}};
  DistLayer layer{cfg, mesh, false, nullptr};
  LayerWeights w;
  CaseInputs in;
};

SpeedProbe::SpeedProbe(int rank) : s_(std::make_unique<State>()) {
  s_->w = s_->layer.shard(init_weights(s_->cfg, 1));
  Case c;
  c.name = "speed-probe", c.T = 256, c.D = s_->cfg.emb_dim, c.F = s_->cfg.moe_mlp_dim, c.E = s_->cfg.num_experts;
  c.K = s_->cfg.num_experts_per_tok, c.seed = 1;
  s_->in = case_inputs(c, uint64_t(rank) + 1);
}

SpeedProbe::~SpeedProbe() = default;

double SpeedProbe::run_ms(Communicator& comm, int iters) {
  if (iters < 1) fail("speed probe: iters must be >= 1 (got ", iters, ")");
  ThreadPool& pool = ThreadPool::compute();
  const int threads = pool.size();
  pool.resize(1);
  std::vector<double> mine;
  try {
    for (int i = 0; i <= iters; ++i) {  // the first step warms up, untimed
      comm.barrier();
      const double t0 = now_ms();
      LayerOutputs out;
      DistForwardPtr f = s_->layer.forward(s_->w, s_->in.x, nullptr, out);
      LayerGrads g = s_->layer.backward(*f, s_->in.dy);
      if (i > 0) mine.push_back(now_ms() - t0);
    }
  } catch (...) {
    pool.resize(threads);
    throw;
  }
  pool.resize(threads);
  return summarize(slowest_per_step(comm, mine)).median_ms;
}

std::vector<double> slowest_per_step(Communicator& comm, const std::vector<double>& mine) {
  const int W = comm.size();
  std::vector<double> all(mine.size() * size_t(W), 0.0), slowest(mine.size(), 0.0);
  comm.all_gather(mine.data(), all.data(), mine.size() * sizeof(double));
  for (size_t i = 0; i < mine.size(); ++i)
    for (int q = 0; q < W; ++q) slowest[i] = std::max(slowest[i], all[size_t(q) * mine.size() + i]);
  return slowest;
}

std::vector<DistResult> run_dist_bench(const DistBenchOptions& o, Communicator& world,
                                       const std::function<void(const DistResult&)>& on_result) {
  if (o.iters < 1) fail("--iters must be >= 1 (got ", o.iters, ")");
  if (o.warmup < 0) fail("--warmup must be >= 0 (got ", o.warmup, ")");
  std::vector<DistResult> results;
  // Ranks outside a variant wait for it here, sleeping between polls, so they
  // do not spin on cores its members need (an oversubscribed machine).
  // Built once: each variant's members run it before and after their steps (a variant's ranks keep
  // their world ranks, and so their tokens).
  std::unique_ptr<SpeedProbe> probe =
      o.speed_probe_iters > 0 ? std::make_unique<SpeedProbe>(world.rank()) : nullptr;
  std::unique_ptr<Communicator> join = world.split(0, world.rank());
  join->set_polite_waits(true);
  for (const DistVariant& v : select_dist_variants(o.variants)) {
    const Config cfg = dist_variant_config(o.base, v);
    DistResult r;
    r.variant = v.name, r.baseline = v.baseline, r.ranks = v.ranks();
    r.skipped = mesh_skip_reason(cfg, v, world.size());
    if (r.skipped.empty()) {
      const bool member = world.rank() < v.ranks();
      std::unique_ptr<Communicator> sub = world.split(member ? 0 : 1, world.rank());
      if (member) r = measure(o, v, cfg, *sub, probe.get());
      char in = 0, all[1024];
      if (join->size() <= int(sizeof all)) join->all_gather(&in, all, 1);  // uncounted in results: after the steps
    }
    if (world.rank() != 0) continue;
    for (const DistResult& b : results)
      if (!r.baseline.empty() && b.variant == r.baseline && b.skipped.empty() && r.skipped.empty()) {
        r.has_baseline = true;
        r.vs_baseline_pct = (r.median_ms / b.median_ms - 1.0) * 100.0;
      }
    results.push_back(r);
    if (on_result) on_result(r);
  }
  return results;
}

}  // namespace moe::bench
