#include "plan/calibrate.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "bench/cases.h"
#include "bench/dist_bench.h"
#include "bench/engine_bytes.h"
#include "bench/timing.h"
#include "comm/machines.h"
#include "moe/dist_layer.h"
#include "moe/isa.h"
#include "moe/mesh.h"
#include "moe/side_engine.h"
#include "moe/thread_pool.h"
#include "moe/trace.h"

namespace moe::plan {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

// Op name without the chunk suffix: "ffn[0]" -> "ffn".
std::string kind_of(const std::string& name) { return name.substr(0, name.find('[')); }

struct StepTimes {
  std::map<std::string, double> op_s;  // median over steps of the per-step sum per kind
  double step_s = 0;
};

// Per kind (and the step), the median of several timings of the same layer: a dip of the
// machine's speed for a second or two inside one of them does not set a rate.
StepTimes median_of(const std::vector<StepTimes>& runs) {
  StepTimes m;
  std::vector<double> steps;
  for (const StepTimes& t : runs) steps.push_back(t.step_s);
  m.step_s = median(steps);
  for (const auto& [k, v] : runs.front().op_s) {
    std::vector<double> ks;
    for (const StepTimes& t : runs)
      if (auto it = t.op_s.find(k); it != t.op_s.end()) ks.push_back(it->second);
    m.op_s[k] = median(ks);
  }
  return m;
}

// The one-rank layer config of a calibrated shape.
Config layer_config(const LayerShape& L) {
  const char* yaml = "num_experts: 8\nnum_experts_per_tok: 2\nemb_dim: 64\nmoe_mlp_dim: 32\n";
  Config cfg =
      parse_config(yaml, "<moe plan --calibrate>",
                   {"num_experts=" + std::to_string(L.E), "num_experts_per_tok=" + std::to_string(L.K),
                    "emb_dim=" + std::to_string(L.D), "moe_mlp_dim=" + std::to_string(L.F),
                    std::string("dtype=") + dtype_name(L.dtype),
                    std::string("weight_dtype=") + dtype_name(L.weight_dtype)})
          .config;
  return cfg;
}

// Steps a one-rank layer `iters` times (after one warm-up) and returns the per-kind medians.
StepTimes time_layer(const LayerShape& L, int iters) {
  Config cfg = layer_config(L);
  std::unique_ptr<Communicator> self = make_single_process_comm();
  Mesh mesh(*self, MeshShape{});
  StepTrace trace(0);
  DistLayer layer(cfg, mesh, false, &trace);
  LayerWeights w = layer.shard(init_weights(cfg, 1));
  bench::Case c;
  c.name = "calibrate", c.T = L.T, c.D = L.D, c.F = L.F, c.E = L.E, c.K = L.K, c.seed = 1;
  bench::CaseInputs in = bench::case_inputs(c, 1);
  std::map<std::string, std::vector<double>> per;
  std::vector<double> steps;
  for (int i = 0; i <= iters; ++i) {
    trace.restart();
    const double t0 = bench::now_ms();
    LayerOutputs out;
    DistForwardPtr f = layer.forward(w, in.x, nullptr, out);
    LayerGrads g = layer.backward(*f, in.dy);
    const double step = (bench::now_ms() - t0) * 1e-3;
    if (i == 0) continue;  // warm-up
    steps.push_back(step);
    std::map<std::string, double> sum;
    for (const TraceOp& op : trace.ops()) sum[kind_of(op.name)] += double(op.end_us - op.start_us) * 1e-6;
    for (const auto& [k, v] : sum) per[k].push_back(v);
  }
  StepTimes t;
  for (auto& [k, v] : per) t.op_s[k] = median(v);
  t.step_s = median(steps);
  return t;
}

double need(const StepTimes& t, const char* kind) {
  auto it = t.op_s.find(kind);
  if (it == t.op_s.end()) fail("moe plan --calibrate: the step trace has no '", kind, "' op");
  return std::max(it->second, 0.5e-6);  // an op under the trace's 1 us resolution: half of it
}

double traced_s(const StepTimes& t) {
  double s = 0;
  for (const auto& [k, v] : t.op_s) s += v;
  return s;
}

double memcpy_gbps() {
  const size_t n = size_t(64) << 20;
  bench::EngineBytes a(n, 1), b(n, 0);  // the tensors' pages (bench/engine_bytes.h)
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const double t0 = bench::now_ms();
    std::memcpy(b.data(), a.data(), n);
    t.push_back((bench::now_ms() - t0) * 1e-3);
  }
  return 2.0 * double(n) / median(t) / 1e9;  // bytes read + written
}

double side_handoff_us() {
  SideEngine side(1);
  std::vector<double> t;
  for (int i = 0; i < 200; ++i) {
    const double t0 = bench::now_ms();
    side.submit("probe", [] {}).wait();
    t.push_back((bench::now_ms() - t0) * 1e3);
  }
  return median(t);
}

// The wait for the slowest peer: every rank does the same 2 ms (one core) of memory work, then a
// 16-byte all-to-all; its median time. On idle cores the ranks arrive together (about α); on shared,
// loaded cores each rank's work is stretched differently and the early ones wait.
double sync_skew_s(Communicator& world) {
  const int W = world.size();
  std::vector<char> a(size_t(4) << 20, 1), b(a.size());
  std::vector<char> send(size_t(8 * W), 1), recv(send.size());
  const A2ALayout layout = A2ALayout::uniform(W, 8);
  std::vector<double> t;
  for (int i = 0; i < 31; ++i) {
    for (int k = 0; k < 4; ++k) std::memcpy(b.data(), a.data(), a.size()), a[size_t(k)] = b[size_t(k + 1)];
    const double t0 = bench::now_ms();
    world.all_to_allv(send.data(), recv.data(), layout, 1);
    if (i > 0) t.push_back((bench::now_ms() - t0) * 1e-3);
  }
  return median(t);
}

// Contention of ranks that share cores (rates.h, Contention), measured with the engine's own
// compute between the collectives: every rank steps the forward of a one-rank layer (the first
// shape at 16 tokens, one pool thread) k = 0, 1, 2, 4, 8 times, then an all-to-all of one chunk's
// rows (64 tokens); its time less its time back to back (k = 0, the α–β cost) is the wait after
// that much compute. Then the side engine: the same all-to-all, polled, submitted after a barrier,
// waited for at once (the compute thread idle) or after four forwards (busy); the difference is
// side_busy (the max over ranks of the rank's mean: the op ends when the last member's worker is
// done). The compute and the wait are the mean over ranks: a rank's wait at a collective is the
// last arrival less its own, so the mean over ranks is max − mean of the arrivals, the spread of
// one interval's compute; the max over ranks (the earliest rank's wait, max − min) counts it
// twice. The slowdown below is the slowest rank's (ranks here differ persistently, for seconds).
Contention contention_probe(const CalibrateOptions& o, Communicator& world, int iters, double lat_s) {
  const int W = world.size();
  LayerShape L = o.shapes.front();
  L.T = std::min<int64_t>(L.T, 16);
  Config cfg = layer_config(L);
  std::unique_ptr<Communicator> self = make_single_process_comm();
  Mesh mesh(*self, MeshShape{});
  DistLayer layer(cfg, mesh, false, nullptr);
  LayerWeights w = layer.shard(init_weights(cfg, 1));
  bench::Case c;
  c.name = "contention", c.T = L.T, c.D = L.D, c.F = L.F, c.E = L.E, c.K = L.K, c.seed = 1;
  bench::CaseInputs in = bench::case_inputs(c, uint64_t(world.rank()) + 1);
  auto work = [&](int k) {
    for (int i = 0; i < k; ++i) {
      LayerOutputs out;
      layer.forward(w, in.x, nullptr, out);
    }
  };
  auto max_over_ranks = [&](double v) {
    std::vector<double> all(size_t(W), 0.0);
    world.all_gather(&v, all.data(), sizeof v);
    return *std::max_element(all.begin(), all.end());
  };
  auto mean_over_ranks = [&](double v) {
    std::vector<double> all(size_t(W), 0.0);
    world.all_gather(&v, all.data(), sizeof v);
    return mean(all);
  };
  // The probe's message: one chunk's rows (64 tokens, K slots, D of dtype) per rank, as the step sends.
  const int64_t block = std::max<int64_t>(64 * L.K * L.D * int64_t(dtype_size(L.dtype)) / W, 1);
  bench::EngineBytes send(size_t(block * W), 1), recv(send.size(), 0);
  const A2ALayout chunk = A2ALayout::uniform(W, block);
  std::unique_ptr<Communicator> polite = world.split(0, world.rank());
  polite->set_polite_waits(true);
  Contention ct;
  double ag_ms = 0, a2a_ms = 0, ar_ms = 0, ar_pair_ms = 0;
  ct.ranks_per_core = double(W) / std::max(1u, std::thread::hardware_concurrency());
  // Compute slowdown: the step's own compute (forward + backward of the first shape at a quarter of
  // its tokens, the T per rank of the validation's mpirun runs; a 16-token forward is bound by the
  // weights' memory traffic and over-states it) on rank 0 alone (the others sleep in a polled
  // all-gather), then on every rank at once; the ratio to what the time slices alone give
  // (max(1, ranks per core)). Twice: with the shape's E experts (every rank holds the whole layer,
  // as under FSDP), then with E / W (each rank's share under expert parallelism, the same tokens):
  // ranks whose weights are smaller contend less for the caches and memory (on 2 cores, 4 ranks of
  // 2 experts 1.02, of 8 experts 1.05-1.15).
  LayerShape Ls = o.shapes.front();
  Ls.T = std::max<int64_t>(Ls.T / 4, 1);
  bench::Case cs = c;
  cs.T = Ls.T;
  const bench::CaseInputs ins = bench::case_inputs(cs, uint64_t(world.rank()) + 1);
  // (together_s, alone_s) of `lay`: the median over blocks of the slowest rank of each block (a
  // step goes at its slowest rank's pace, and ranks differ persistently here: a core that runs
  // slower for seconds, which the mean rank would miss), and rank 0's median alone.
  auto slowdown_of = [&](DistLayer& lay, const LayerWeights& lw, const char* what) {
    auto timed_block = [&](std::vector<double>& t) {
      const double t0 = bench::now_ms();
      LayerOutputs out;
      DistForwardPtr f = lay.forward(lw, ins.x, nullptr, out);
      LayerGrads g = lay.backward(*f, ins.dy);
      t.push_back((bench::now_ms() - t0) * 1e-3);
    };
    std::vector<double> alone, together;
    double alone_s = 0;
    if (world.rank() == 0)
      for (int i = 0; i <= iters; ++i) timed_block(alone);
    if (world.rank() == 0) alone.erase(alone.begin()), alone_s = median(alone);
    {
      std::vector<double> all(size_t(W), 0.0);
      polite->all_gather(&alone_s, all.data(), sizeof alone_s);
      alone_s = all[0];
    }
    for (int i = 0; i <= iters; ++i) {
      world.barrier();
      timed_block(together);
    }
    together.erase(together.begin());
    const double mean_rank_s = mean_over_ranks(median(together));
    const double together_s = median(bench::slowest_per_step(world, together));
    const double slow = std::max(together_s / (alone_s * std::max(1.0, ct.ranks_per_core)), 1.0);
    if (world.rank() == 0 && o.log)
      o.log(std::string("  ") + what + ": " + std::to_string(together_s * 1e3).substr(0, 6) + " ms (slowest rank; mean rank " +
            std::to_string(mean_rank_s * 1e3).substr(0, 6) + ") against " + std::to_string(alone_s * 1e3).substr(0, 6) +
            " ms alone -> slowdown " + std::to_string(slow).substr(0, 5));
    return slow;
  };
  ct.compute_slowdown = slowdown_of(layer, w, "the whole layer on every rank");
  ct.weight_bytes = expert_weight_bytes(L, L.E);
  if (L.E / W >= 1 && W > 1) {
    LayerShape Lsmall = L;
    Lsmall.E = L.E / W;
    Lsmall.K = std::min(L.K, Lsmall.E);
    Config small_cfg = layer_config(Lsmall);
    DistLayer small(small_cfg, mesh, false, nullptr);
    const LayerWeights sw = small.shard(init_weights(small_cfg, 1));
    ct.small_compute_slowdown = slowdown_of(small, sw, ("E/W = " + std::to_string(Lsmall.E) + " experts").c_str());
    ct.small_weight_bytes = expert_weight_bytes(Lsmall, Lsmall.E);
  }
  // The wait curve. Ranks that run persistently unequal for seconds (a VM's core taken by its
  // host) make every wait of the curve that imbalance, which the steps measured later need not
  // meet: in out/v79's second round the slower of 2 ranks took 1.19x the mean rank's compute and
  // the curve's waits came out 2-5x the first round's (docs/distributed.md, "Validation on this
  // machine"). So with a core or more per rank (ranks that should run alike) the curve is measured
  // again, up to kCurveAttempts times in all, while its ranks' spread (the slowest rank's compute
  // over the mean rank's, summed over the curve) exceeds kCalmSpread, and the calmest attempt is
  // kept. A skew that lasts (a slower node) is in every attempt, so in the curve. Ranks that share
  // a core take turns on it, and their spread is that sharing: measured once.
  struct Curve {
    std::vector<double> compute_s, wait_s;
    std::string text;
    double work4 = 0;  // this rank's four forwards with every rank computing, nothing in flight
    double spread = 1;
  };
  auto measure_curve = [&] {
    Curve c;
    double back_to_back = 0;  // k = 0: the all-to-all's own cost, which the α–β terms already give
    double total = 0;         // this rank's compute over the curve
    for (int k : {0, 1, 2, 4, 8}) {
      std::vector<double> cw, tw;
      for (int i = 0; i <= iters; ++i) {
        world.barrier();
        const double t0 = bench::now_ms();
        work(k);
        const double t1 = bench::now_ms();
        world.all_to_allv(send.data(), recv.data(), chunk, 1);
        const double t2 = bench::now_ms();
        if (i > 0) cw.push_back((t1 - t0) * 1e-3), tw.push_back((t2 - t1) * 1e-3);
      }
      total += mean(cw);
      if (k == 4) c.work4 = mean(cw);
      const double cs = mean_over_ranks(mean(cw)), ts = mean_over_ranks(mean(tw));
      c.text +=
          " " + std::to_string(cs * 1e3).substr(0, 6) + " ms: " + std::to_string(ts * 1e3).substr(0, 6) + ";";
      if (!c.compute_s.empty() && cs <= c.compute_s.back()) continue;  // keep the points ascending
      c.compute_s.push_back(cs);
      if (k == 0) back_to_back = ts;
      c.wait_s.push_back(std::max(ts - back_to_back, 0.0));
    }
    const double mean_total = mean_over_ranks(total);
    c.spread = mean_total > 0 ? max_over_ranks(total) / mean_total : 1.0;
    return c;
  };
  // Every rank decides alike (the curve is collective): by the densest rank's ranks per core.
  const bool own_cores = max_over_ranks(ct.ranks_per_core) <= 1;
  std::vector<double> spreads;
  Curve best = calmest_attempt(measure_curve, own_cores ? kCurveAttempts : 1, &spreads);
  ct.compute_s = best.compute_s, ct.wait_s = best.wait_s;
  std::string curve = best.text + " (ranks' spread";
  for (double sp : spreads) curve += " " + std::to_string(sp).substr(0, 5);
  curve += ", kept " + std::to_string(best.spread).substr(0, 5) + ")";
  double work4_alone = best.work4;
  // All-gather bandwidth inside a host: the ranks of each host gather 8 MiB from each (the size of
  // a layer's gradient or weight shard), MPI's own waits, every host at once; per rank, as a ring
  // all-gather's β: (H-1)·n / (t - (H-1)·α) for H ranks per host. Not measured (0) when a host has
  // one rank or the hosts differ in ranks: the model then halves the link per shared core.
  std::unique_ptr<Communicator> host = world.split_by_host(world.rank());
  const int H = host->size();
  const bool same_on_every_host = max_over_ranks(H) == -max_over_ranks(-H);
  if (same_on_every_host && H > 1) {
    const int64_t n = int64_t(8) << 20;
    // The median over up to 8 calls after `warm` (the slowest rank's), less the latency term, but
    // at most half of it: under load (a sanitizer build, 4 ranks on 2 cores) the latency estimate
    // can exceed the collective's own time, and the rate must stay a positive, finite figure.
    auto timed_s = [&](int warm, const std::function<void(int)>& call) {
      std::vector<double> t;
      for (int i = 0; i < std::min(iters, 8) + warm; ++i) {
        world.barrier();
        const double t0 = bench::now_ms();
        call(i);
        if (i >= warm) t.push_back((bench::now_ms() - t0) * 1e-3);
      }
      const double raw = max_over_ranks(median(t));
      return std::max(raw - (H - 1) * lat_s, 0.5 * raw);
    };
    bench::EngineBytes mine(size_t(n), 1), all(size_t(n) * size_t(H), 0);
    // The first call maps the buffers.
    const double s = timed_s(1, [&](int) { host->all_gather(mine.data(), all.data(), size_t(n)); });
    ct.ag_bw_Bps = double(n) * (H - 1) / std::max(s, 1e-9);
    ag_ms = s * 1e3;
    // The all-to-all of the same 8 MiB per rank inside each host (n/H to each member): per rank,
    // as a flat all-to-all's β, n(H-1)/H / (t - (H-1)·α). The step's all-to-alls and the engine's
    // reduce-scatters (all-to-alls of blocks) are priced at it. Each call moves buffers the calls
    // before did not touch (four pairs in turn, the first four calls mapping them), as the step's
    // gradients and staging come from memory: the same buffers every call stay in the last-level
    // cache (4 ranks on this 2-core VM: 0.66 ms against 0.87 for 8 MiB per rank, 1.74 against 1.91
    // for 16).
    const A2ALayout even = A2ALayout::uniform(H, n / H);
    std::vector<std::unique_ptr<bench::EngineBytes>> sends, recvs;
    for (int b = 0; b < 4; ++b)
      sends.push_back(std::make_unique<bench::EngineBytes>(size_t(n), 1)),
          recvs.push_back(std::make_unique<bench::EngineBytes>(size_t(n), 0));
    const double sa = timed_s(4, [&](int i) {
      host->all_to_allv(sends[size_t(i % 4)]->data(), recvs[size_t(i % 4)]->data(), even, 1);
    });
    ct.a2a_bw_Bps = double(n / H * H) * (H - 1) / H / std::max(sa, 1e-9);
    a2a_ms = sa * 1e3;
    // The engine's all-reduce of 16 MiB of f32 per rank (an expert weight's gradient at the
    // validation's layer: 8 x 1024 x 512) over the host's ranks, then over pairs of them at once
    // where a host has 4 or more: per rank, the vector's bytes over the call's time. The step's
    // all-reduces inside a host of that many ranks (or pairs) are priced at it: at 2 ranks per core
    // the α–β sum of its parts priced this one at 5.8 ms where it took 7.9-10.0 (docs/distributed.md).
    // Fresh vectors each call (two pairs in turn), as the step's gradients come from memory.
    const size_t nf = size_t(n) * 2 / sizeof(float);
    std::vector<std::unique_ptr<bench::EngineBytes>> ar_in, ar_out;
    for (int b = 0; b < 2; ++b)
      ar_in.push_back(std::make_unique<bench::EngineBytes>(nf * sizeof(float), 0)),
          ar_out.push_back(std::make_unique<bench::EngineBytes>(nf * sizeof(float), 0));
    auto all_reduce_s = [&](Communicator& group) {
      return timed_s(2, [&](int i) {
        group.all_reduce_sum(reinterpret_cast<const float*>(ar_in[size_t(i % 2)]->data()),
                             reinterpret_cast<float*>(ar_out[size_t(i % 2)]->data()), nf);
      });
    };
    const double s_all = all_reduce_s(*host), ar_bytes = double(nf * sizeof(float));
    ct.ar_bw_Bps = ar_bytes / std::max(s_all, 1e-9), ct.ar_ranks = H;
    ar_ms = s_all * 1e3;
    if (H == 2) {
      ct.ar_pair_bw_Bps = ct.ar_bw_Bps, ar_pair_ms = ar_ms;
    } else if (H % 2 == 0) {
      std::unique_ptr<Communicator> pair = host->split(host->rank() / 2, host->rank());
      const double s_pair = all_reduce_s(*pair);
      ct.ar_pair_bw_Bps = ar_bytes / std::max(s_pair, 1e-9);
      ar_pair_ms = s_pair * 1e3;
    }
  }
  // Side engine: a polled all-to-all of one chunk's rows (T·K rows of D), compute thread idle or busy.
  SideEngine side(1);
  bench::EngineBytes& big = send;
  bench::EngineBytes& bigr = recv;
  double side_s[2] = {0, 0};
  for (int busy = 0; busy < 2; ++busy) {
    std::vector<double> d;
    for (int i = 0; i <= iters; ++i) {
      world.barrier();
      double ts0 = 0, ts1 = 0;
      Event e = side.submit("contention probe", [&] {
        ts0 = bench::now_ms();
        polite->all_to_allv(big.data(), bigr.data(), chunk, 1);
        ts1 = bench::now_ms();
      });
      if (busy) work(4);
      e.wait();
      if (i > 0) d.push_back((ts1 - ts0) * 1e-3);
    }
    side_s[busy] = max_over_ranks(mean(d));
  }
  ct.side_busy_s = std::max(side_s[1] - side_s[0], 0.0);
  // The compute's stretch while side ops are in flight: the worker runs enough of the same
  // all-to-alls back to back to outlast four forwards (the same count on every rank), the compute
  // thread runs the four forwards; their extra time over four forwards with nothing in flight
  // (alternating with them, so both meet the same phases of the machine), per second of overlap
  // with the worker's span, is side_cpu_frac (the mean over ranks).
  const int reps = int(std::ceil(max_over_ranks(work4_alone / std::max(side_s[0], 1e-6)))) + 1;
  std::vector<double> alone4, stretched, overlap;
  for (int i = 0; i < 2 * (iters + 1); ++i) {
    const bool with = i % 2 == 1;
    world.barrier();
    double ts0 = 0, ts1 = 0;
    Event e;
    if (with)
      e = side.submit("contention probe", [&] {
        ts0 = bench::now_ms();
        for (int r = 0; r < reps; ++r) polite->all_to_allv(big.data(), bigr.data(), chunk, 1);
        ts1 = bench::now_ms();
      });
    const double w0 = bench::now_ms();
    work(4);
    const double w1 = bench::now_ms();
    if (with) e.wait();
    if (i < 2) continue;  // the first pair warms up
    if (!with) alone4.push_back((w1 - w0) * 1e-3);
    else
      stretched.push_back((w1 - w0) * 1e-3),
          overlap.push_back(std::max(0.0, std::min(w1, ts1) - std::max(w0, ts0)) * 1e-3);
  }
  work4_alone = median(alone4);
  const double frac = median(overlap) > 1e-4 ? (median(stretched) - work4_alone) / median(overlap) : 0.0;
  ct.side_cpu_frac = std::clamp(mean_over_ranks(std::clamp(frac, 0.0, 1.0)), 0.0, 1.0);
  // The compute's stretch while its worker waits for peers that have not arrived, as in the step
  // (an op submitted ahead of the compute that produces a peer's part): in every other iteration
  // each rank's worker enters a small polled all-to-all before four forwards, except one rank (in
  // turn) whose worker enters it after them; the waiting ranks' extra time of the forwards over
  // the iterations with nothing in flight, per second of overlap with the wait, is side_wait_frac
  // (the mean over ranks of each rank's median). The workers run with the run's scheduling policy
  // (MOE_SIDE_ENGINE_RT): a real-time worker preempts the compute at each poll.
  if (W > 1) {
    SideEngine waiter(1, side_engine_realtime_requested());
    bench::EngineBytes tiny_s(size_t(W), 1), tiny_r(size_t(W), 0);
    const A2ALayout one = A2ALayout::uniform(W, 1);
    std::vector<double> alone, waited, wait_ov;
    const int pairs = std::max(iters, 2) + 2 * W;
    for (int i = 0; i < 2 * pairs; ++i) {
      const bool with = i % 2 == 1, late = (i / 2) % W == world.rank();
      world.barrier();
      double ts0 = 0, ts1 = 0;
      auto enter = [&] {
        return waiter.submit("wait probe", [&] {
          ts0 = bench::now_ms();
          polite->all_to_allv(tiny_s.data(), tiny_r.data(), one, 1);
          ts1 = bench::now_ms();
        });
      };
      Event e;
      if (with && !late) e = enter();
      const double w0 = bench::now_ms();
      work(4);
      const double w1 = bench::now_ms();
      if (with && late) e = enter();
      if (with) e.wait();
      if (i < 2) continue;  // the first pair warms up
      if (!with)
        alone.push_back((w1 - w0) * 1e-3);
      else if (!late)
        waited.push_back((w1 - w0) * 1e-3),
            wait_ov.push_back(std::max(0.0, std::min(w1, ts1) - std::max(w0, ts0)) * 1e-3);
    }
    const double wf =
        !waited.empty() && median(wait_ov) > 1e-4 ? (median(waited) - median(alone)) / median(wait_ov) : 0.0;
    ct.side_wait_frac = mean_over_ranks(std::clamp(wf, 0.0, 3.0));
  }
  char ag_text[512];
  if (ct.ag_bw_Bps > 0)
    std::snprintf(ag_text, sizeof ag_text,
                  "all-gather of 8 MiB per rank inside each host (%d ranks) %.3f ms -> %.3f GB/s per rank; "
                  "all-to-all of 8 MiB per rank there %.3f ms -> %.3f GB/s per rank; all-reduce of 16 MiB of "
                  "f32 per rank there %.3f ms -> %.3f GB/s, over pairs %.3f ms -> %.3f GB/s",
                  H, ag_ms, ct.ag_bw_Bps / 1e9, a2a_ms, ct.a2a_bw_Bps / 1e9, ar_ms, ct.ar_bw_Bps / 1e9,
                  ar_pair_ms, ct.ar_pair_bw_Bps / 1e9);
  else
    std::snprintf(ag_text, sizeof ag_text, "all-gather inside a host not measured (%d rank(s) on this one)", H);
  if (o.log && world.rank() == 0) {
    char b[1536];
    std::snprintf(
        b, sizeof b,
        "; side engine's all-to-all of %lld B per peer: %.3f ms idle, %.3f ms busy -> side_busy %.1f us; "
        "four forwards %.3f ms alone, %.3f ms beside %d of them -> side_cpu_frac %.3f; beside a worker "
        "waiting for a late peer -> side_wait_frac %.3f; %s",
        (long long)block, side_s[0] * 1e3, side_s[1] * 1e3, ct.side_busy_s * 1e6, work4_alone * 1e3,
        median(stretched) * 1e3, reps, ct.side_cpu_frac, ct.side_wait_frac, ag_text);
    o.log("  contention at " + std::to_string(ct.ranks_per_core).substr(0, 4) + " ranks per core: slowdown " +
          std::to_string(ct.compute_slowdown).substr(0, 5) + " (" + std::to_string(ct.small_compute_slowdown).substr(0, 5) +
          " with E/W experts); a chunk's all-to-all after compute of" + curve + b);
  }
  return ct;
}

// Between hosts (every rank on a host of its own), the network stack's CPU per byte from the large
// probe's polite pass: the busy time of rank 0's machine over the bytes of the ranks that share it
// (the same boot id). Collective.
void network_cpu(Rates& r, Communicator& world, const bench::ProbeResult& large) {
  const int W = world.size();
  const int alone = world.split_by_host(world.rank())->size() == 1;
  std::vector<int> alone_all(size_t(W), 0);
  world.all_gather(&alone, alone_all.data(), sizeof(int));
  if (std::count(alone_all.begin(), alone_all.end(), 1) != W) return;  // ranks share a host (every rank sees it)
  constexpr size_t kId = 64;
  char mine[kId] = {};
  std::strncpy(mine, boot_id().c_str(), kId - 1);
  std::vector<char> ids(kId * size_t(W));
  world.all_gather(mine, ids.data(), kId);
  if (mine[0] == 0) return;
  int on_machine = 0;
  for (int k = 0; k < W; ++k) on_machine += std::strncmp(&ids[size_t(k) * kId], &ids[0], kId) == 0;
  r.comm_cpu_ns_per_byte = network_cpu_ns_per_byte(large.busy_core_ms, large.bytes_out, on_machine);
}

// Bytes to each peer per call of the link's bandwidth probe (intra_link).
constexpr int64_t kProbeMessageBytes = int64_t(256) << 10;

void intra_link(Rates& r, Communicator& world) {
  if (world.size() < 2) {
    r.intra.bw_Bps = r.memcpy_gbps * 1e9 / 4;  // MPI's shared memory: two copies (in and out) per byte
    r.intra.lat_s = 2e-6;                      // a default, not measured: run under mpirun -np 2 to measure
    r.intra.sync_s = 0;
    r.intra_measured = false;
    return;
  }
  const int W = world.size();
  const int64_t big = int64_t(8) << 20;
  // The 8 MiB in calls of kProbeMessageBytes to each peer: the size of the layer's all-to-all
  // messages (a chunk's rows over the ranks: 64-256 KiB in the validated steps). One call of 4 MiB
  // to each peer takes MPI's rendezvous path, which the step's messages do not: over TCP at 1gbit
  // (2 hosts x 1 rank) it moved 665-722 Mbit/s against 752-775 in calls of 256 KiB, at 4 hosts x 1
  // rank 1 MiB messages 228-231 against 288-289 in 256 KiB (2026-12-06).
  const int calls = int(std::max<int64_t>(big / (int64_t(W) * kProbeMessageBytes), 1));
  bench::ProbeResult small = bench::probe_all_to_all(world, 8 * W, 50);
  bench::ProbeResult large = bench::probe_all_to_all(world, big, 5, calls);
  // A flat all-to-all of n bytes per rank: (W-1)·α + n(W-1)/W/β, per call.
  r.intra.lat_s = small.median_ms * 1e-3 / (W - 1);
  const double beta_s = std::max(large.median_ms * 1e-3 - calls * (W - 1) * r.intra.lat_s, 1e-9);
  r.intra.bw_Bps = double(big) * (W - 1) / W / beta_s;
  r.intra.sync_s = sync_skew_s(world) - r.intra.lat_s * (W - 1);
  r.intra.sync_s = std::max(r.intra.sync_s, 0.0);
  r.intra_measured = true;
  network_cpu(r, world, large);
}

}  // namespace

double network_cpu_ns_per_byte(double busy_core_ms, int64_t bytes_out, int ranks) {
  if (busy_core_ms <= 0 || bytes_out <= 0 || ranks < 1) return 0;
  return busy_core_ms * 1e6 / (double(bytes_out) * ranks);
}

Rates calibrate(const CalibrateOptions& o, Communicator& world) {
  Rates r;
  if (world.size() > 1) {  // under mpirun: the link and the contention (the kernels: one process alone)
    intra_link(r, world);
    ThreadPool& pool = ThreadPool::compute();
    const int threads = pool.size();
    pool.resize(1);  // one pool thread per rank, as moe bench --dist runs under MOE_NUM_THREADS=1
    if (!o.shapes.empty())
      r.contention.push_back(contention_probe(o, world, std::max(5 * o.iters, 20), r.intra.lat_s));
    pool.resize(threads);
    return r;
  }
  if (o.shapes.empty()) fail("moe plan --calibrate: no layer shape to measure");
  ThreadPool& pool = ThreadPool::compute();
  const int full = o.pool_threads > 0 ? o.pool_threads : pool.size();
  auto log = [&](const std::string& s) {
    if (o.log && world.rank() == 0) o.log(s);
  };
  r.isa = isa_name(active_isa());
  r.pool_threads = full;
  r.memcpy_gbps = memcpy_gbps();
  // The speed probe around every timing (Rates::probe_ms): the cores change speed for seconds to
  // minutes at a time (one timing of a small shape 1.4x slower than the next, 2026-12-06), so each
  // timing is scaled to the median of all the probes, by the mean of the probe just before it and
  // the one just after; a measurement that runs the same probe is then predicted at the speed the
  // machine had during it.
  const int probe_iters = std::max(o.iters, 3);
  bench::SpeedProbe probe(world.rank());
  std::vector<double> probes{probe.run_ms(world, probe_iters)};
  struct Timed {  // one timing and the probes on either side of it (indices into `probes`)
    StepTimes t;
    size_t before = 0;
  };
  auto timed = [&](const LayerShape& L) {
    Timed x;
    x.before = probes.size() - 1;
    x.t = time_layer(L, o.iters);
    probes.push_back(probe.run_ms(world, probe_iters));
    return x;
  };
  struct Point {  // one shape at one token count: one thread three times, the full pool three times
    LayerShape L;
    int64_t div = 1;
    std::vector<Timed> one, all;
  };
  std::vector<Point> points;
  pool.resize(1);
  for (const LayerShape& base : o.shapes)
    for (int64_t div : {16, 4, 1}) {
      Point p;
      p.L = base;
      p.L.T = std::max<int64_t>(base.T / div, 1);
      p.div = div;
      // One thread, three times where the pool is timed against it (alternating with the pool: one
      // thread measured before the pool measures the phase, not the pool); the rates from the median
      // of the three (out/v53: a dip inside one timing had moved a GEMM point by a quarter).
      p.one.push_back(timed(p.L));
      if (full > 1)
        for (int k = 0; k < 3; ++k) {
          pool.resize(full);
          p.all.push_back(timed(p.L));
          pool.resize(1);
          if (k < 2) p.one.push_back(timed(p.L));
        }
      points.push_back(std::move(p));
    }
  r.probe_ms = median(probes);
  auto at_reference = [&](const Timed& x) {  // the timing at the reference probe's speed
    const double scale = r.probe_ms / ((probes[x.before] + probes[x.before + 1]) / 2);
    StepTimes t = x.t;
    t.step_s *= scale;
    for (auto& [k, v] : t.op_s) v *= scale;
    return t;
  };
  {
    std::vector<double> sorted = probes;
    std::sort(sorted.begin(), sorted.end());
    log("  speed probe: " + std::to_string(probes.size()) + " runs around the timings, " +
        std::to_string(sorted.front()) + " to " + std::to_string(sorted.back()) + " ms, median " +
        std::to_string(r.probe_ms) + " ms: every timing scaled to the median");
  }
  bool first = true;
  std::map<std::string, std::vector<double>> scalar;
  for (const Point& p : points) {
    const LayerShape& L = p.L;
    std::vector<StepTimes> one;
    for (const Timed& x : p.one) one.push_back(at_reference(x));
    std::vector<double> all;
    for (const Timed& x : p.all) all.push_back(at_reference(x).step_s);
    const StepTimes t = median_of(one);
    const double R = double(L.T * L.K), D = double(L.D), F = double(L.F), E = double(L.E), T = double(L.T);
    const double b = double(dtype_size(L.dtype)), flops = 6 * R * D * F;
    GemmPoint g;
    g.dtype = L.dtype, g.D = L.D, g.F = L.F, g.experts = L.E, g.rows_per_expert = R / E;
    g.ffn_gflops = flops / need(t, "ffn") / 1e9;
    g.ffn_backward_gflops = flops / need(t, "ffn_backward") / 1e9;
    g.weight_grads_gflops = flops / need(t, "weight_grads") / 1e9;
    if (!all.empty()) {  // the whole step at the full pool against one thread, at this point (medians,
                         // as the validation measures steps)
      g.pool_speedup = t.step_s / median(all);
      log("  pool of " + std::to_string(full) + " threads at T=" + std::to_string(L.T) + ": step " +
          std::to_string(median(all) * 1e3) + " ms against " + std::to_string(t.step_s * 1e3) +
          " ms at one thread -> speedup " + std::to_string(g.pool_speedup));
    }
    r.gemm.push_back(g);
    std::string ops;
    for (const auto& [k, v] : t.op_s) ops += " " + k + "=" + std::to_string(v * 1e3).substr(0, 6);
    log("    per op (ms):" + ops);
    log(std::string("  ") + dtype_name(L.dtype) + " T=" + std::to_string(L.T) + " D=" + std::to_string(L.D) +
        " F=" + std::to_string(L.F) + " E=" + std::to_string(L.E) + " K=" + std::to_string(L.K) + ": step " +
        std::to_string(t.step_s * 1e3) + " ms (traced ops " + std::to_string(traced_s(t) * 1e3) + " ms), ffn " +
        std::to_string(g.ffn_gflops) + " GFLOP/s");
    if (!first) continue;
    // The scalar rates: the median over the first shape's three token counts (one noisy op of a
    // loaded machine does not set a rate).
    scalar["router"].push_back(2 * T * D * E / need(t, "router") / 1e9);
    scalar["router_backward"].push_back(4 * T * D * E / need(t, "router_backward") / 1e9);
    scalar["sort"].push_back(need(t, "sort") / R * 1e9);
    scalar["permute"].push_back(2 * R * D * b / need(t, "permute") / 1e9);
    scalar["combine"].push_back((R + T) * D * b / need(t, "combine") / 1e9);
    scalar["combine_backward"].push_back(2 * R * D * b / need(t, "combine_backward") / 1e9);
    scalar["permute_backward"].push_back((R * D * b + T * D * 4) / need(t, "permute_backward") / 1e9);
    if (p.div != 1) continue;
    first = false;
    if (full > 1) r.pool_speedup = g.pool_speedup;  // the file's own: the first shape's full T
  }
  r.router_gflops = median(scalar["router"]);
  r.router_backward_gflops = median(scalar["router_backward"]);
  r.sort_ns_per_row = median(scalar["sort"]);
  r.permute_gbps = median(scalar["permute"]);
  r.combine_gbps = median(scalar["combine"]);
  r.combine_backward_gbps = median(scalar["combine_backward"]);
  r.permute_backward_gbps = median(scalar["permute_backward"]);
  pool.resize(full);
  r.side_op_overhead_us = side_handoff_us();
  intra_link(r, world);
  Contention alone;  // one rank on the machine: the rates above, no waits
  alone.ranks_per_core = 1.0 / std::max(1u, std::thread::hardware_concurrency());
  r.set_contention(alone);
  r.comm_cpu_ns_per_byte = 1.3;  // not measured here: docs/benchmarks.md's TCP probe, 2.7 core-ms per 2.1 MB
  const unsigned hc = std::thread::hardware_concurrency();
  r.machine =
      std::to_string(hc) + " logical CPUs, " + std::to_string(world.size()) + " rank(s) during calibration";
  return r;
}

}  // namespace moe::plan
