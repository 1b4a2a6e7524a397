#include "plan/step_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "moe/comm.h"
#include "moe/error.h"

namespace moe::plan {

std::string Layout::offload_text() const {
  if (off_fsdp && off_ep && off_sort) return "all";
  std::string s;
  for (auto [on, name] :
       {std::pair{off_fsdp, "fsdp_all_gather"}, {off_ep, "ep_collectives"}, {off_sort, "ragged_sort"}})
    if (on) s += (s.empty() ? "" : ",") + std::string(name);
  return s;
}

std::string Layout::name() const {
  std::ostringstream o;
  o << "d" << data << " f" << fsdp << " e" << expert << " c" << chunks;
  if (ring) o << " ring";
  const std::string off = offload_text();
  o << " +" << (off.empty() ? "none" : off);
  if (expert > 1 && !ring) o << " " << a2a_algo_name(a2a);
  return o.str();
}

std::string check_layout(const LayerShape& L, const Layout& lay, const Cluster& cl) {
  std::ostringstream o;
  if (lay.data < 1 || lay.fsdp < 1 || lay.expert < 1 || lay.chunks < 1)
    o << "mesh sizes and chunks must be >= 1";
  else if (lay.ranks() != cl.ranks())
    o << "data*fsdp*expert=" << lay.ranks() << " but the cluster has " << cl.ranks() << " ranks";
  else if (L.E % lay.expert)
    o << "num_experts=" << L.E << " is not divisible by expert_parallelism=" << lay.expert;
  else if (L.D % lay.fsdp)
    o << "emb_dim=" << L.D << " is not divisible by fsdp_parallelism=" << lay.fsdp;
  else if (lay.ring && lay.expert == 1)
    o << "the ring of experts needs expert_parallelism > 1";
  else if (L.T < lay.chunks)
    o << "fewer tokens per rank (" << L.T << ") than chunks (" << lay.chunks << ")";
  return o.str();
}

double side_stretch(const std::vector<SideSpan>& pending, double t, double dur, double steal, double cpu_frac,
                    double wait_frac, bool peers_late) {
  double extra = 0, in_spans = 0;
  const double waiting = peers_late ? wait_frac : 0.0;
  for (const SideSpan& s : pending)
    if (s.end > s.start) {
      const double ov = std::max(0.0, std::min(t + dur, s.end) - std::max(t, s.start));
      extra += steal * std::max({s.cpu / (s.end - s.start), cpu_frac, waiting}) * ov;
      in_spans += ov;
    }
  if (waiting > 0 && !pending.empty()) {
    const double from = std::max(t, pending.front().start);
    extra += steal * wait_frac * std::max(0.0, t + dur - from - in_spans);
  }
  return extra;
}

namespace {

// A side-engine or inline event: when it is ready, the term its wait is charged to, and the side
// op it ends (-1: inline), whose end can still move earlier (Sim::wait).
struct Ev {
  double ready = 0;
  std::string term;
  int side = -1;
};

// How ranks sharing cores stretch the collectives (rates.h, Contention), at this cluster's ranks per core.
struct ContentionModel {
  const Rates* r = nullptr;
  double ranks_per_core = 0;
  double wait(double compute_s) const { return r ? r->wait_at(ranks_per_core, compute_s) : 0; }
  double side_busy() const { return r ? r->side_busy_at(ranks_per_core) : 0; }
  double side_cpu_frac() const { return r ? r->side_cpu_frac_at(ranks_per_core) : 0; }
  double side_wait_frac() const { return r ? r->side_wait_frac_at(ranks_per_core) : 0; }
};

// The two timelines. Compute ops run back to back on the compute thread; a side op starts when it
// is submitted and the FIFO worker is free. A compute op overlapping a side op's CPU work is
// stretched by `steal` of that work (the two share the rank's cores): of its own CPU seconds spread
// over its span, or of the measured side_cpu_frac of the span if that is more. Where ranks share
// cores, a worker holding an op the compute thread has not waited for yet also waits for peers that
// have not arrived, outside the ops' own spans too (the spans have no wait for the slowest member;
// in the step such an op ends when its peers' compute does, about when this rank waits for it): the
// compute is stretched by side_wait_frac of that time (side_stretch). Contention: an inline
// collective first waits for the slowest member (ContentionModel::wait of the compute since the
// compute thread's previous collective or wait); a side op takes side_busy longer, unless the
// compute thread blocks on it (or on a later op) first: then it ends when its own cost is done.
class Sim {
 public:
  Sim(Prediction& p, double steal, double handoff_s, ContentionModel cm)
      : p_(p), steal_(steal), handoff_(handoff_s), cm_(cm) {}

  void compute(const std::string& name, const std::string& term, double dur) {
    // Ops before waited_ have ended (FIFO; the compute thread waited for the last of them).
    pending_.clear();
    for (size_t i = waited_; i < side_.size(); ++i)
      pending_.push_back({side_[i].start, side_[i].end, side_[i].cpu});
    const double penalty = side_stretch(pending_, t_, dur, steal_, cm_.side_cpu_frac(), cm_.side_wait_frac(),
                                        cm_.ranks_per_core > 1);
    record(name, false, false, t_, t_ + dur + penalty);
    p_.compute_s += dur + penalty;
    p_.cpu_s += dur + penalty;
    p_.terms[term] += dur + penalty;
    t_ += dur + penalty;
  }

  // A collective of `cost` (+ `extra` seconds of local work in the same op: copies, ordered sums);
  // `cpu`: the seconds of one core it keeps busy.
  Ev collective(bool offloaded, const std::string& name, const std::string& term, const Cost& cost,
                double extra, double cpu) {
    const double dur = cost.total() + extra;
    p_.comm_s += cost.total();
    p_.terms[term] += dur;
    if (!offloaded) {
      const double wait = cm_.wait(t_ - synced_);
      record(name, false, true, t_, t_ + wait + dur);
      p_.exposed_comm_s += wait + dur;
      p_.exposed[term] += wait + dur;
      if (wait > 0) p_.terms["contention wait"] += wait;
      p_.cpu_s += cpu + extra;
      t_ += wait + dur;
      synced_ = t_;
      return {t_, term};
    }
    return side(name, term, dur, cpu + extra);
  }

  Ev side(const std::string& name, const std::string& term, double dur, double cpu) {
    t_ += handoff_;  // submit and the later wake-up, charged to the compute thread
    p_.compute_s += handoff_;
    p_.cpu_s += handoff_;
    p_.terms["side hand-off"] += handoff_;
    p_.cpu_s += cpu;
    // Its CPU work shares the rank's cores with the compute thread as the compute shares them with it
    // (`steal`): while the compute thread computes, the op takes `stretch` times its cost.
    const double stretch = dur > 0 ? 1 + steal_ * std::clamp(cpu / dur, 0.0, 1.0) : 1.0;
    side_.push_back({t_, dur, cm_.side_busy(), 0, 0, cpu, p_.ops.size(), stretch});
    record(name, true, false, 0, 0);
    retime(side_.size() - 1);
    p_.side_busy_s += dur;
    return {side_.back().end, term, int(side_.size() - 1)};
  }

  void wait(const Ev& e) {
    double ready = e.ready;
    if (e.side >= 0) {
      // The compute thread blocks from now, and the worker gets a core: the op (and every one before
      // it) ends when its own cost is done and the slowest member has arrived too (the same wait for
      // the slowest member as an inline collective's), or as it would have anyway if that is sooner.
      const double slowest = t_ + cm_.wait(t_ - synced_);
      for (size_t i = 0; i <= size_t(e.side); ++i) {
        SideIv& s = side_[i];
        // What is left of its work from now runs at full speed (the worker has the core).
        const double done = std::clamp((t_ - s.start) / s.stretch, 0.0, s.dur);
        const double own = std::max(s.start, t_) + s.dur - done, cut = std::max(own, slowest);
        if (cut < s.end) {
          s.busy = cut - (s.start + s.dur * s.stretch);
          retime(i);
        }
      }
      ready = side_[size_t(e.side)].end;
      waited_ = std::max(waited_, size_t(e.side) + 1);
    }
    if (ready <= t_) return;
    record("wait:" + e.term, false, true, t_, ready);
    p_.exposed_comm_s += ready - t_;
    p_.exposed[e.term] += ready - t_;
    t_ = ready;
    synced_ = t_;
  }

  double now() const { return t_; }

 private:
  struct SideIv {
    double submit, dur, busy, start, end, cpu;
    size_t op;  // its record in p_.ops
    double stretch;
  };
  // Start and end of side op i and every later one (FIFO: each starts when the one before ends).
  void retime(size_t i) {
    for (; i < side_.size(); ++i) {
      SideIv& s = side_[i];
      s.start = std::max(s.submit, i > 0 ? side_[i - 1].end : 0.0);
      s.end = s.start + s.dur * s.stretch + s.busy;
      p_.ops[s.op].start = s.start, p_.ops[s.op].end = s.end;
    }
  }
  void record(const std::string& name, bool side, bool comm, double a, double b) {
    p_.ops.push_back({name, side, comm, a, b});
  }
  Prediction& p_;
  double steal_, handoff_;
  ContentionModel cm_;
  double t_ = 0, synced_ = 0;
  std::vector<SideIv> side_;
  size_t waited_ = 0;  // side ops the compute thread has waited for (the first ones: FIFO)
  std::vector<SideSpan> pending_;  // compute()'s view of side_[waited_..], kept to reuse its storage
};

// prepare / compute / finish over n chunks with `lookahead` chunks prepared ahead (run_pipeline of
// src/distributed/dist_step.h).
void pipeline(int64_t n, int64_t look, const std::function<void(int64_t)>& prep,
              const std::function<void(int64_t)>& comp, const std::function<void(int64_t)>& fin,
              const std::function<void()>& before_drain) {
  for (int64_t c = 0; c < std::min(look, n); ++c) prep(c);
  for (int64_t c = 0; c < n; ++c) {
    if (look == 0)
      prep(c);
    else if (c + look < n)
      prep(c + look);
    comp(c);
    if (c >= look) fin(c - look);
  }
  before_drain();
  for (int64_t c = std::max<int64_t>(n - look, 0); c < n; ++c) fin(c);
}

// Everything the schedule needs about one step: sizes, groups, links, op costs.
struct Step {
  const LayerShape& L;
  const Layout& lay;
  const Cluster& cl;
  const Rates& r;
  Sim& sim;
  double speed = 1, b = 2, wb = 4;
  Link intra, inter;  // intra: the all-to-alls' bandwidth where the rates measured it at this density
  Link intra_ag;      // intra for the all-gathers: their measured bandwidth where the rates have it
  // Ranks per core at which one host's all-reduces take the rates' measurement (-1: none).
  double ar_rpc = -1;
  Group ep, fs, dfs, world;
  int64_t El = 1, n = 1, Tc = 1, Rc = 1;

  double flops_s(double flops, double gflops) const { return flops / (gflops * 1e9 * speed); }
  double bytes_s(double bytes, double gbps) const { return bytes / (gbps * 1e9 * speed); }
  double copy_s(double bytes) const { return bytes_s(bytes, r.memcpy_gbps); }
  // CPU seconds of a collective: the copies (one host), or the TCP stack's work per byte.
  double cpu_of(const Group& g, const Cost& c, double bytes) const {
    return g.hosts() == 1 ? c.beta_s : bytes * r.comm_cpu_ns_per_byte * 1e-9;
  }
  // An offloaded collective over g. It runs beside the compute unless the rank has no core to spare
  // (a core or less a rank) and g is inside one host: such an op is all copies, which only the
  // rank's own core share can do, and the engine's collectives measured no faster offloaded than
  // inline there (docs/distributed.md, "Offload without a spare core"). Then it runs inline.
  bool beside(bool off, const Group& g) const { return off && !(cl.cores_per_rank() <= 1 && g.hosts() == 1); }
  Ev coll(bool off, const Group& g, const std::string& name, const std::string& term, const Cost& cost,
          double extra, double cpu) {
    return sim.collective(beside(off, g), name, term, cost, extra, cpu);
  }
  GemmPoint gemm(double rows_per_expert) const { return r.ffn_at(L.dtype, L.D, L.F, rows_per_expert, El); }
  // Rows this rank's experts compute in chunk c, and over the step (LayerShape::busiest_*: the
  // slowest rank's; else uniform routing, Rc per chunk).
  bool routed() const { return int64_t(L.busiest_chunk_rows.size()) == n && lay.expert > 1; }
  double rows(int64_t c) const { return routed() ? L.busiest_chunk_rows[size_t(c)] : double(Rc); }
  double step_rows() const {
    return routed() && L.busiest_step_rows > 0 ? L.busiest_step_rows : double(Rc * n);
  }
  double ffn_flops(double rows) const { return 6.0 * rows * double(L.D) * double(L.F); }
  // Rows of the expert-parallel receive buffer (ragged_buffer_factor -1: R·min(EP, E/K)).
  double buffer_rows() const { return double(Rc) * std::min<double>(lay.expert, double(L.E) / double(L.K)); }
  // Communicator::all_reduce_sum of n bytes per rank over g: where it splits (all_reduce_splits: 3
  // ranks or more, (G-1)·n >= kSplitAllReduceBytes), an all-to-all of the parts (a reduce-scatter),
  // the rank-order sum of G parts (n bytes read, n/G written) and an all-gather of the parts; else an
  // all-gather of the whole vectors and the sum of all G of them on every rank. `cost`: the
  // collectives; `extra`: the sums; the CPU seconds. Inside one host, where the rates measured the
  // engine's all-reduce of a group of this size at this many ranks per core (Rates::ar_bw_at), the
  // whole call is priced at that bandwidth instead (β = n / bw, with the parts' α; no separate
  // sums): at 2 ranks per core its parts, sums and copies take turns on the cores, and the parts'
  // sum priced a 16 MiB all-reduce over 4 ranks at 5.8 ms where it took 7.9-10.0 (docs/distributed.md).
  struct AllReduce {
    Cost cost;
    double extra = 0, cpu = 0;
  };
  AllReduce all_reduce(const Group& g, double n) const {
    const double G = g.size;
    AllReduce a;
    if (!Communicator::all_reduce_splits(g.size, size_t(n / 4))) {
      a.cost = all_gather(g, n, intra_ag, inter);
      a.extra = copy_s(G * n + n);
      a.cpu = cpu_of(g, a.cost, n * (G - 1));  // each rank's whole vector to each of the G-1 others
    } else {
      const Cost rs = all_to_all(A2AAlgo::flat, g, n, intra, inter),
                 ag = all_gather(g, n / G, intra_ag, inter);
      a.cost = {rs.alpha_s + ag.alpha_s, rs.beta_s + ag.beta_s};
      a.extra = copy_s(n + n / G);
      a.cpu = cpu_of(g, rs, n * (G - 1) / G) + cpu_of(g, ag, n * (G - 1) / G);
    }
    const double bw = ar_rpc >= 0 && g.hosts() == 1 && g.size > 1 ? r.ar_bw_at(ar_rpc, g.size) : 0;
    if (bw > 0) {
      a.cost.beta_s = n / bw, a.extra = 0;
      a.cpu = a.cost.beta_s;  // copies and sums: the rank's own CPU work
    }
    return a;
  }
  double local_sort_s(double rows) const {  // ep_sort_local + ep_unsort_local: the buffer in, the rows out
    return lay.expert > 1 ? copy_s((buffer_rows() + 3.0 * rows) * double(L.D) * b) : 0;
  }
};

}  // namespace

double expert_weight_bytes(const LayerShape& L, int64_t experts) {
  const double copies = double(dtype_size(L.weight_dtype)) + (L.weight_dtype != L.dtype ? double(dtype_size(L.dtype)) : 0);
  return double(experts) * 3 * double(L.D) * double(L.F) * copies;
}

double compute_slowdown(const LayerShape& L, const Layout& lay, const Cluster& cl, const Rates& r,
                        const ModelOptions& o, double others_busy) {
  const double rpc = cl.cores > 0 ? double(cl.ranks_per_host) / cl.cores : 0;
  const double slow =
      1 + (r.compute_slowdown_at(rpc, expert_weight_bytes(L, L.E / std::max(1, lay.expert))) - 1) *
              std::clamp(others_busy, 0.0, 1.0);
  if (o.probe_ms <= 0) return slow;
  if (r.probe_ms <= 0) fail("a paired speed probe needs rates with speed_probe_ms (calibrate them again)");
  return slow * o.probe_ms / (r.probe_ms * std::max(1.0, rpc) * r.compute_slowdown_at(rpc));
}

double core_share(double cores_per_rank, double others_busy) {
  if (cores_per_rank >= 1 || cores_per_rank <= 0) return cores_per_rank;
  return 1 / (1 + (1 / cores_per_rank - 1) * std::clamp(others_busy, 0.0, 1.0));
}

namespace {

Step make_step(const LayerShape& L, const Layout& lay, const Cluster& cl, const Rates& r, Sim& sim,
               const ModelOptions& o, double others_busy) {
  Step s{L, lay, cl, r, sim, 1, 2, 4, {}, {}, {}, {}, {}, {}, {}, 1, 1, 1, 1};
  const int threads = cl.threads > 0 ? cl.threads : std::max(1, int(std::floor(cl.cores_per_rank())));
  s.b = double(dtype_size(L.dtype));
  s.wb = double(dtype_size(L.weight_dtype));
  s.intra = cl.intra.bw_Bps > 0 ? cl.intra : r.intra;
  // The rates' sync (one wait per collective, measured at -np 2) is superseded by their contention
  // rows, which measure the wait as a function of the compute before it (Sim).
  s.intra.sync_s = cl.sync_given                           ? cl.intra.sync_s
                   : cl.hosts == 1 && r.contention.empty() ? r.intra.sync_s
                                                           : 0;
  s.intra.bw_Bps *= std::min(1.0, cl.cores_per_rank());  // shared-memory copies are CPU work
  // Large all-gathers at this many ranks per core run faster than that share of the all-to-all's
  // bandwidth (docs/distributed.md, "Model of scale"): their own measurement where there is one.
  // The same for the all-to-alls (and the reduce-scatters, which are all-to-alls of blocks in the
  // engine): at 2 ranks per core on this machine 7.8-8.2 GB/s per rank, below the halved link (10.8).
  s.intra_ag = s.intra;
  if (cl.intra.bw_Bps <= 0 && cl.cores > 0) {
    const double rpc = double(cl.ranks_per_host) / cl.cores;
    const double ag = r.ag_bw_at(rpc), a2a = r.a2a_bw_at(rpc);
    if (ag > 0) s.intra_ag.bw_Bps = ag;
    if (a2a > 0) s.intra.bw_Bps = a2a;
    s.ar_rpc = rpc;
  }
  s.inter = cl.inter;
  s.inter.sync_s = cl.sync_given ? cl.intra.sync_s : 0;
  const int rph = cl.ranks_per_host;
  s.ep = make_group(lay.expert, 1, rph);
  s.fs = make_group(lay.fsdp, lay.expert, rph);
  s.dfs = make_group(lay.data * lay.fsdp, lay.expert, rph);
  s.world = make_group(lay.ranks(), 1, rph);
  s.El = L.E / lay.expert;
  s.n = std::min<int64_t>(lay.chunks, L.T);
  s.Tc = L.T / s.n;
  s.Rc = s.Tc * L.K;
  // The pool's speedup at the step's rows per expert; ranks sharing cores also slow each other's
  // compute (rates.h, Contention::compute_slowdown).
  const GemmPoint at = r.ffn_at(L.dtype, L.D, L.F, double(s.Rc) / double(s.El), s.El);
  s.speed = r.speed(core_share(cl.cores_per_rank(), others_busy), threads, &at) /
            compute_slowdown(L, lay, cl, r, o, others_busy);
  return s;
}

const char* kWeights[] = {"experts.wi_0", "experts.wi_1", "experts.wo"};

// issue_weight_gathers: cast each stored shard to dtype, gather it over fsdp (FIFO: wi_1 done => wi_0 done).
void weight_gathers(Step& s, Ev& up, Ev& down) {
  const double shard = double(s.El) * double(s.L.D) * double(s.L.F) / s.lay.fsdp;
  Ev ev[3];
  for (int w = 0; w < 3; ++w) {
    if (s.L.weight_dtype != s.L.dtype)
      s.sim.compute("cast:" + std::string(kWeights[w]), "cast", s.copy_s(shard * (s.b + s.wb)));
    if (s.lay.fsdp == 1) continue;
    const Cost c = ring_all_gather(s.fs, shard * s.b, s.intra_ag, s.inter);
    const double place = s.copy_s(2 * shard * s.lay.fsdp * s.b);  // the tiled gather's placement copy
    ev[w] = s.coll(s.lay.off_fsdp, s.fs, "AG:" + std::string(kWeights[w]), "AG:weights", c, place,
                   s.cpu_of(s.fs, c, shard * s.b * (s.lay.fsdp - 1)));
  }
  up = ev[1], down = ev[2];
}

// The FFN forward of one chunk: waits for the up projections before the first GEMM, wo before the last.
void ffn_forward(Step& s, const std::string& name, double rows, double extra) {
  const GemmPoint g = s.gemm(rows / double(s.El));
  const double t = s.flops_s(s.ffn_flops(rows), g.ffn_gflops);
  s.sim.compute(name, "ffn", t * 2 / 3 + extra);
  s.sim.compute(name + ":wo", "ffn", t / 3);
}

void forward_a2a(Step& s, std::vector<Ev>& routed, const Ev& up, const Ev& down) {
  const double row_bytes = double(s.L.D) * s.b;
  std::vector<Ev> sent(size_t(s.n)), ret(size_t(s.n));
  const bool off = s.lay.off_ep, ep = s.lay.expert > 1;
  auto prep = [&](int64_t c) {
    s.sim.wait(routed[size_t(c)]);
    s.sim.compute("permute", "permute", s.bytes_s(2.0 * double(s.Rc) * row_bytes, s.r.permute_gbps));
    if (!ep) return;
    const Cost cc = all_gather(s.ep, double(s.L.E) * 8, s.intra_ag, s.inter);
    Ev planned = s.coll(off, s.ep, "AG:counts", "AG:counts", cc, 0, 0);
    if (!off) s.sim.wait(planned);
    const double bytes = double(s.Rc) * row_bytes;
    const Cost a = all_to_all(s.lay.a2a, s.ep, bytes, s.intra, s.inter);
    sent[size_t(c)] = s.coll(off, s.ep, "A2A:dispatch", "A2A", a, 0, s.cpu_of(s.ep, a, bytes));
  };
  bool waited_weights = false;
  auto comp = [&](int64_t c) {
    s.sim.wait(sent[size_t(c)]);
    if (!waited_weights) s.sim.wait(up);
    const double rows = s.rows(c);
    const GemmPoint g = s.gemm(rows / double(s.El));
    const double t = s.flops_s(s.ffn_flops(rows), g.ffn_gflops);
    s.sim.compute("ffn", "ffn", t * 2 / 3 + s.local_sort_s(rows) / 2);
    if (!waited_weights) s.sim.wait(down), waited_weights = true;
    s.sim.compute("ffn:wo", "ffn", t / 3 + s.local_sort_s(rows) / 2);
    if (!ep) return;
    const double bytes = double(s.Rc) * row_bytes;
    const Cost a = all_to_all(s.lay.a2a, s.ep, bytes, s.intra, s.inter);
    ret[size_t(c)] = s.coll(off, s.ep, "A2A:return", "A2A", a, 0, s.cpu_of(s.ep, a, bytes));
  };
  auto fin = [&](int64_t c) {
    s.sim.wait(ret[size_t(c)]);
    s.sim.compute("combine", "combine", s.bytes_s(double(s.Rc + s.Tc) * row_bytes, s.r.combine_gbps));
  };
  pipeline(s.n, off ? 1 : 0, prep, comp, fin, [] {});
}

void forward_ring(Step& s, std::vector<Ev>& routed, const Ev& up, const Ev& down) {
  const double row_bytes = double(s.L.D) * s.b, P = s.lay.expert;
  std::vector<Ev> got(size_t(s.n)), red(size_t(s.n));
  const bool off = s.lay.off_ep;
  auto prep = [&](int64_t c) {
    s.sim.wait(routed[size_t(c)]);
    Cost a = all_gather(s.ep, double(s.Tc) * row_bytes, s.intra_ag, s.inter);
    const Cost k = all_gather(s.ep, double(s.Tc * s.L.K) * 9, s.intra_ag, s.inter);  // ids, weights, keep
    a.alpha_s += k.alpha_s, a.beta_s += k.beta_s;
    got[size_t(c)] = s.coll(off, s.ep, "AG:tokens", "AG:ring", a, 0,
                            s.cpu_of(s.ep, a, double(s.Tc) * row_bytes * (P - 1)));
  };
  bool waited_weights = false;
  auto comp = [&](int64_t c) {
    s.sim.wait(got[size_t(c)]);
    if (!waited_weights) s.sim.wait(up), s.sim.wait(down), waited_weights = true;
    // Route the gathered tokens, permute this rank's rows, FFN, combine into [EP*Tc, D] f32 partials.
    const double rows = s.rows(c);
    const double route = double(s.Rc) * P * s.r.sort_ns_per_row * 1e-9 / s.speed;
    const double perm = s.bytes_s(2.0 * rows * row_bytes, s.r.permute_gbps);
    const double part = s.copy_s(P * double(s.Tc) * double(s.L.D) * 4 + rows * row_bytes);
    ffn_forward(s, "ffn", rows, route + perm + part);
    const Cost rs = ring_reduce_scatter(s.ep, double(s.Tc) * double(s.L.D) * 4, s.intra, s.inter);
    const double add = s.copy_s(P * double(s.Tc) * double(s.L.D) * 4);
    red[size_t(c)] = s.coll(off, s.ep, "RS:y", "RS:ring", rs, add,
                            s.cpu_of(s.ep, rs, double(s.Tc) * double(s.L.D) * 4 * (P - 1)));
  };
  auto fin = [&](int64_t c) {
    s.sim.wait(red[size_t(c)]);
    s.sim.compute("combine", "combine", s.copy_s(double(s.Tc) * double(s.L.D) * (4 + s.b)));
  };
  pipeline(s.n, off ? 1 : 0, prep, comp, fin, [] {});
}

// weight_grads, then each expert gradient back to its shard (boundary: AR over data x fsdp and keep
// the shard; explicit plan: reduce_to_shard, an all-to-all of shards; offloaded as reduce_scatter).
// Offloaded, wo's gradient (a third of the FLOPs) is computed first and sent while wi's are.
void weight_grads(Step& s, std::vector<Ev>& reduced) {
  const double rows = s.step_rows();
  const GemmPoint g = s.gemm(rows / double(s.El));
  const double merge = s.n > 1 ? s.copy_s(2.0 * rows * double(2 * s.L.D + 4 * s.L.F) * s.b) : 0;
  const double all = s.flops_s(s.ffn_flops(rows), g.weight_grads_gflops);
  const int G = s.dfs.size;
  const double full = double(s.El) * double(s.L.D) * double(s.L.F) * 4;
  const bool expl = s.lay.off_fsdp && s.lay.fsdp > 1;
  auto reduce = [&](const char* w) {
    Cost c;
    double extra, cpu;
    if (expl) {  // every member's shard packed from the gradient, sent to it, the G shards added
      const double shard = full / s.lay.fsdp, bytes = G * shard;
      c = all_to_all(A2AAlgo::flat, s.dfs, bytes, s.intra, s.inter);
      extra = s.copy_s(bytes) + s.copy_s(bytes + shard);
      cpu = s.cpu_of(s.dfs, c, bytes * (G - 1) / G);
    } else {  // the engine's deterministic all-reduce of the full gradient
      const Step::AllReduce a = s.all_reduce(s.dfs, full);
      c = a.cost, extra = a.extra, cpu = a.cpu;
    }
    reduced.push_back(s.coll(s.lay.off_fsdp, s.dfs, std::string(expl ? "RS:grad." : "AR:grad.") + w,
                             "grad:experts", c, extra, cpu));
  };
  if (G == 1 || !s.lay.off_fsdp) {
    s.sim.compute("weight_grads", "weight_grads", all + merge);
    if (G > 1)
      for (const char* w : kWeights) reduce(w);
    return;
  }
  s.sim.compute("weight_grads", "weight_grads", all / 3 + merge);
  reduce("experts.wo");
  s.sim.compute("weight_grads", "weight_grads", all * 2 / 3);
  reduce("experts.wi_0");
  reduce("experts.wi_1");
}

void backward_a2a(Step& s, std::vector<Ev>& reduced) {
  const double row_bytes = double(s.L.D) * s.b;
  std::vector<Ev> sent(size_t(s.n)), ret(size_t(s.n));
  const bool off = s.lay.off_ep, ep = s.lay.expert > 1;
  auto prep = [&](int64_t c) {
    s.sim.compute("combine_backward", "combine_backward",
                  s.bytes_s(2.0 * double(s.Rc) * row_bytes, s.r.combine_backward_gbps));
    if (!ep) return;
    const double bytes = double(s.Rc) * row_bytes;
    const Cost a = all_to_all(s.lay.a2a, s.ep, bytes, s.intra, s.inter);
    sent[size_t(c)] = s.coll(off, s.ep, "A2A:dispatch_grad", "A2A", a, 0, s.cpu_of(s.ep, a, bytes));
  };
  auto comp = [&](int64_t c) {
    s.sim.wait(sent[size_t(c)]);
    const double rows = s.rows(c);
    const GemmPoint g = s.gemm(rows / double(s.El));
    s.sim.compute("ffn_backward", "ffn_backward",
                  s.flops_s(s.ffn_flops(rows), g.ffn_backward_gflops) + s.local_sort_s(rows));
    if (!ep) return;
    const double bytes = double(s.Rc) * row_bytes;
    const Cost a = all_to_all(s.lay.a2a, s.ep, bytes, s.intra, s.inter);
    ret[size_t(c)] = s.coll(off, s.ep, "A2A:return_grad", "A2A", a, 0, s.cpu_of(s.ep, a, bytes));
  };
  auto fin = [&](int64_t c) {
    s.sim.wait(ret[size_t(c)]);
    s.sim.compute("permute_backward", "permute_backward",
                  s.bytes_s(double(s.Rc) * row_bytes + double(s.Tc * s.L.D) * 4, s.r.permute_backward_gbps));
  };
  pipeline(s.n, off ? 1 : 0, prep, comp, fin, [&] { weight_grads(s, reduced); });
}

void backward_ring(Step& s, std::vector<Ev>& reduced) {
  const double row_bytes = double(s.L.D) * s.b, P = s.lay.expert;
  std::vector<Ev> sent(size_t(s.n)), ret(size_t(s.n));
  const bool off = s.lay.off_ep;
  auto prep = [&](int64_t c) {
    const Cost a = all_gather(s.ep, double(s.Tc) * row_bytes, s.intra_ag, s.inter);
    sent[size_t(c)] =
        s.coll(off, s.ep, "AG:dy", "AG:ring", a, 0, s.cpu_of(s.ep, a, double(s.Tc) * row_bytes * (P - 1)));
  };
  auto comp = [&](int64_t c) {
    s.sim.wait(sent[size_t(c)]);
    const double rows = s.rows(c);
    const GemmPoint g = s.gemm(rows / double(s.El));
    const double cb =
        s.bytes_s(2.0 * rows * row_bytes + P * double(s.Tc * s.L.D) * 4, s.r.combine_backward_gbps);
    s.sim.compute("ffn_backward", "ffn_backward", s.flops_s(s.ffn_flops(rows), g.ffn_backward_gflops) + cb);
    Cost rs = ring_reduce_scatter(s.ep, double(s.Tc * s.L.D) * 4, s.intra, s.inter);
    const Cost rw = ring_reduce_scatter(s.ep, double(s.Tc * s.L.K) * 4, s.intra, s.inter);
    rs.alpha_s += rw.alpha_s, rs.beta_s += rw.beta_s;
    const double add = s.copy_s(P * double(s.Tc) * double(s.L.D + s.L.K) * 4);
    ret[size_t(c)] = s.coll(off, s.ep, "RS:dx", "RS:ring", rs, add,
                            s.cpu_of(s.ep, rs, double(s.Tc * s.L.D) * 4 * (P - 1)));
  };
  auto fin = [&](int64_t c) {
    s.sim.wait(ret[size_t(c)]);
    s.sim.compute("copy_dx", "permute_backward", s.copy_s(double(s.Tc * s.L.D) * 8));
  };
  pipeline(s.n, off ? 1 : 0, prep, comp, fin, [&] { weight_grads(s, reduced); });
}

Prediction simulate_step(const LayerShape& L, const Layout& lay, const Cluster& cl, const Rates& r,
                         const ModelOptions& o, double others_busy) {
  Prediction p;
  p.layout = lay;
  p.others_busy = others_busy;
  p.compute_cores = core_share(cl.cores_per_rank(), others_busy);
  const double steal = o.steal >= 0 ? o.steal : std::clamp(2 - cl.cores_per_rank(), 0.0, 1.0);
  ContentionModel cm{&r, cl.cores > 0 ? double(cl.ranks_per_host) / cl.cores : 0};
  Sim sim(p, steal, r.side_op_overhead_us * 1e-6, cm);
  Step s = make_step(L, lay, cl, r, sim, o, others_busy);
  const double T = double(L.T), D = double(L.D), E = double(L.E);
  // Forward (DistLayer::forward).
  Ev up, down;
  weight_gathers(s, up, down);
  sim.compute("router", "router", s.flops_s(2 * T * D * E, r.router_gflops));
  const Cost stats = all_gather(s.world, E * 24 + 40, s.intra_ag, s.inter);
  sim.collective(false, "AG:aux_stats", "AG:aux_stats", stats, 0, 0);
  std::vector<Ev> routed(size_t(s.n));
  const double sort_s = double(s.Rc) * r.sort_ns_per_row * 1e-9 / s.speed;
  for (int64_t c = 0; c < s.n; ++c) {
    if (lay.off_sort)
      routed[size_t(c)] = sim.side("sort", "sort", sort_s, sort_s);
    else
      sim.compute("sort", "sort", sort_s);
  }
  if (lay.ring)
    forward_ring(s, routed, up, down);
  else
    forward_a2a(s, routed, up, down);
  // Backward (DistLayer::backward).
  std::vector<Ev> reduced;
  if (lay.ring)
    backward_ring(s, reduced);
  else
    backward_a2a(s, reduced);
  sim.compute("router_backward", "router_backward", s.flops_s(4 * T * D * E, r.router_backward_gflops));
  if (lay.ranks() > 1) {
    const Step::AllReduce ar = s.all_reduce(s.world, D * E * 4);
    sim.collective(false, "AR:grad.router.kernel", "AR:router", ar.cost, ar.extra, 0);
  }
  for (const Ev& e : reduced) sim.wait(e);
  p.step_s = sim.now();
  return p;
}

}  // namespace

Prediction predict_step(const LayerShape& L, const Layout& lay, const Cluster& cl, const Rates& r,
                        const ModelOptions& o) {
  if (o.others_busy >= 0) return simulate_step(L, lay, cl, r, o, std::min(o.others_busy, 1.0));
  Prediction p = simulate_step(L, lay, cl, r, o, 1.0);
  // No other rank of the job on its cores. The one beside it may be another host's: hosts that
  // share a machine's cores (cores < 1 per host, 4 hosts on 2 cores here) yield to each other alike.
  if (cl.cores_per_rank() >= 1 || cl.ranks() < 2) return p;
  // Ranks sharing cores: again at the busy fraction the last prediction gives (f(u) = cpu_s / step_s
  // grows with u, and f(1) <= 1, so u_k falls monotonically to the largest fixed point).
  for (int k = 0; k < 30; ++k) {
    const double u = std::clamp(p.step_s > 0 ? p.cpu_s / p.step_s : 1.0, 0.0, 1.0);
    if (u >= p.others_busy - 1e-4) break;
    p = simulate_step(L, lay, cl, r, o, u);
  }
  return p;
}

}  // namespace moe::plan
