#include "bench/real_use.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/cases.h"
#include "bench/harness.h"
#include "bench/timing.h"
#include "core/allocator.h"
#include "core/counter_rng.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "moe/thread_pool.h"

extern char** environ;

namespace moe::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double seconds(const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); }

// CPU times, faults and allocator counters from the start of a phase to its end.
class PhaseMeter {
 public:
  PhaseMeter() {
    getrusage(RUSAGE_SELF, &r0_);
    a0_ = alloc::stats();
  }
  void finish(RealUseRow& row, const std::vector<double>& step_ms) const {
    rusage r1{};
    getrusage(RUSAGE_SELF, &r1);
    alloc::Stats a1 = alloc::stats();
    row.steps = int(step_ms.size());
    for (double ms : step_ms) row.seconds += ms / 1000.0;
    row.gflops = row.flops / std::max(row.seconds, 1e-9) / 1e9;
    row.step_ms_median = summarize(step_ms).median_ms;
    row.user_s = seconds(r1.ru_utime) - seconds(r0_.ru_utime);
    row.sys_s = seconds(r1.ru_stime) - seconds(r0_.ru_stime);
    row.sys_share = row.sys_s / std::max(row.user_s + row.sys_s, 1e-9);
    row.minflt_per_step = double(r1.ru_minflt - r0_.ru_minflt) / std::max<double>(row.steps, 1);
    row.peak_rss_mib = peak_rss_mib();
    row.rss_mib = rss_mib();
    row.alloc_hits = a1.hits - a0_.hits;
    row.alloc_partial = a1.partial - a0_.partial;
    row.alloc_misses = a1.misses - a0_.misses;
    row.alloc_evictions = a1.evictions - a0_.evictions;
    row.alloc_fresh_mib_per_step = double(a1.fresh_bytes - a0_.fresh_bytes) / kMiB / std::max<double>(row.steps, 1);
    row.alloc_cached_mib = double(a1.cached_bytes) / kMiB;
  }

 private:
  rusage r0_{};
  alloc::Stats a0_{};
};

// The case's fused variant (what a user runs); the accumulate scenario keeps
// f32 master weights (cast to the compute dtype every step), as a trainer does.
Config fused_config(const Case& c, DType dtype, const std::string& scenario) {
  for (const Variant& v : case_variants(c)) {
    if (v.name != "fused") continue;
    Config cfg = variant_config(c, dtype, v);
    if (scenario == "accumulate") cfg.weight_dtype = DType::f32;
    return cfg;
  }
  fail("case ", c.name, " has no fused variant");
}

// A fresh [rows, cols] copy of rows [begin, begin + rows) of `src` (a new
// tensor each step, as a data loader would hand over).
Tensor fresh_rows(const Tensor& src, int64_t begin, int64_t rows) {
  Tensor t = Tensor::empty(src.dtype(), {rows, src.shape()[1]});
  const size_t row_bytes = src.nbytes() / size_t(src.shape()[0]);
  std::memcpy(t.raw(), static_cast<const std::byte*>(src.raw()) + size_t(begin) * row_bytes,
              size_t(rows) * row_bytes);
  return t;
}

// Inputs for up to `rows` tokens of case `c`.
struct Pool {
  Case c;
  CaseInputs in;
  Pool(Case base, int64_t rows, uint64_t seed) : c(std::move(base)) {
    Case big = c;
    big.T = rows;
    in = case_inputs(big, seed);
  }
};

// One fwd+bwd over rows [begin, begin + T) of the pool; returns the weight gradients.
LayerGrads step(const Config& cfg, const LayerWeights& w, const Pool& p, int64_t begin, int64_t T) {
  Tensor x = fresh_rows(p.in.x, begin, T);
  Tensor dy = fresh_rows(p.in.dy, begin, T);
  Tensor idx;
  if (p.in.forced()) idx = fresh_rows(p.in.topk_idx, begin, T);
  LayerOutputs out;
  auto fwd = layer_forward(cfg, w, x, p.in.forced() ? &idx : nullptr, out);
  return layer_backward(cfg, *fwd, dy);
}

double step_flops(Case c, int64_t T) {
  c.T = T;
  return forward_backward_flops(c);
}

RealUseRow new_row(const std::string& scenario, const std::string& phase, const Case& c) {
  RealUseRow r;
  r.scenario = scenario, r.phase = phase, r.case_name = c.name;
  r.T_min = r.T_max = c.T;
  r.D = c.D, r.F = c.F, r.E = c.E, r.K = c.K;
  return r;
}

// `steps` timed steps at fixed T (after `warmup` untimed ones).
RealUseRow fixed_phase(const std::string& scenario, const std::string& phase, const Case& c,
                       const RealUseOptions& o) {
  Config cfg = fused_config(c, o.dtype, scenario);
  LayerWeights w = init_weights(cfg, c.seed);
  Pool p(c, c.T, o.seed);
  for (int i = 0; i < o.warmup; ++i) step(cfg, w, p, 0, c.T);
  RealUseRow row = new_row(scenario, phase, c);
  PhaseMeter m;
  std::vector<double> ms;
  for (int i = 0; i < o.steps; ++i) {
    double t0 = now_ms();
    step(cfg, w, p, 0, c.T);
    ms.push_back(now_ms() - t0);
    row.flops += step_flops(c, c.T);
  }
  m.finish(row, ms);
  return row;
}

// T drawn every step from [0.75 T, 1.25 T] (counter_rng keyed by the seed).
RealUseRow changing_phase(const Case& c, const RealUseOptions& o) {
  Config cfg = fused_config(c, o.dtype, "changing-t");
  LayerWeights w = init_weights(cfg, c.seed);
  const int64_t lo = std::max<int64_t>(1, c.T * 3 / 4), hi = c.T * 5 / 4;
  Pool p(c, hi, o.seed);
  const uint64_t key = stream_key(c.seed, o.seed, 7);
  auto draw = [&](int i) {
    return lo + std::min<int64_t>(
                    hi - lo, int64_t(unit_open_high(counter_bits(key, uint64_t(i))) * double(hi - lo + 1)));
  };
  int i = 0;
  for (; i < o.warmup; ++i) step(cfg, w, p, 0, draw(i));
  RealUseRow row = new_row("changing-t", "changing-t", c);
  row.T_min = hi, row.T_max = lo;
  PhaseMeter m;
  std::vector<double> ms;
  for (int s = 0; s < o.steps; ++s, ++i) {
    const int64_t T = draw(i);
    row.T_min = std::min(row.T_min, T), row.T_max = std::max(row.T_max, T);
    double t0 = now_ms();
    step(cfg, w, p, 0, T);
    ms.push_back(now_ms() - t0);
    row.flops += step_flops(c, T);
  }
  m.finish(row, ms);
  return row;
}

// Training steps: 2 micro-batches of T tokens each, the second's weight gradients added in place
// into the first's (f32), then w -= lr * acc / 2 and the gradients dropped.
RealUseRow accumulate_phase(const Case& c, const RealUseOptions& o) {
  Config cfg = fused_config(c, o.dtype, "accumulate");
  LayerWeights w = init_weights(cfg, c.seed);
  Pool p(c, 2 * c.T, o.seed);
  w.for_each(cfg, [&](const std::string& name, const Tensor& t) {
    if (t.dtype() != DType::f32) fail("accumulate: weight ", name, " is not f32");
  });
  // PyTorch's flow with MoELayer(accumulate_grads=True): the first micro-batch's backward returns
  // fresh f32 gradients, the second adds its own into them in place (BackwardOptions::accumulate),
  // the optimizer reads them, and zero_grad drops them (set_to_none).
  auto micro_batch = [&](int64_t begin, LayerWeights* acc) {
    Tensor x = fresh_rows(p.in.x, begin, c.T);
    Tensor dy = fresh_rows(p.in.dy, begin, c.T);
    Tensor idx;
    if (p.in.forced()) idx = fresh_rows(p.in.topk_idx, begin, c.T);
    LayerOutputs out;
    auto fwd = layer_forward(cfg, w, x, p.in.forced() ? &idx : nullptr, out);
    return layer_backward(cfg, *fwd, dy, {}, BackwardOptions{.release_saved = true, .accumulate = acc});
  };
  auto train_step = [&] {
    LayerWeights acc = micro_batch(0, nullptr).weights;
    micro_batch(c.T, &acc);
    const float lr = 1e-3f / 2;
    std::vector<const Tensor*> accs;
    acc.for_each(cfg, [&](const std::string&, const Tensor& t) { accs.push_back(&t); });
    size_t k = 0;
    w.for_each(cfg, [&](const std::string&, Tensor& t) {
      float* wd = t.data<float>();
      const float* ad = accs[k++]->data<float>();
      parallel_for(t.numel(), 1 << 16, [&](int64_t s, int64_t e) {
        for (int64_t j = s; j < e; ++j) wd[j] -= lr * ad[j];
      });
    });
  };
  for (int i = 0; i < o.warmup; ++i) train_step();
  RealUseRow row = new_row("accumulate", "accumulate", c);
  PhaseMeter m;
  std::vector<double> ms;
  for (int s = 0; s < o.steps; ++s) {
    double t0 = now_ms();
    train_step();
    ms.push_back(now_ms() - t0);
    row.flops += 2 * step_flops(c, c.T);
  }
  m.finish(row, ms);
  return row;
}

std::string dtype_arg(DType d) { return d == DType::f32 ? "f32" : "bf16"; }

// Runs this program as `bench --scenario SCENARIO --alone --case NAME ...`
// (the case's fixed-T steps, `steps` of them, `extra` overrides after the
// run's own) with a JSON file, and reads its one row back as phase `phase`.
RealUseRow fresh_process_row(const Case& c, const RealUseOptions& o, const std::string& phase, int steps,
                             const std::vector<std::string>& extra) {
  char path[] = "/tmp/moe-real-use-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) fail("--scenario ", o.scenario, ": cannot create a temporary file in /tmp: ", std::strerror(errno));
  close(fd);
  std::vector<std::string> args = {o.self_exe.empty() ? "/proc/self/exe" : o.self_exe,
                                   "bench",
                                   "--scenario",
                                   o.scenario,
                                   "--alone",
                                   "--case",
                                   c.name,
                                   "--steps",
                                   std::to_string(steps),
                                   "--warmup",
                                   std::to_string(o.warmup),
                                   "--dtype",
                                   dtype_arg(o.dtype),
                                   "--seed",
                                   std::to_string(o.seed),
                                   "--json",
                                   path};
  for (const std::string& kv : o.overrides) args.push_back(kv);
  for (const std::string& kv : extra) args.push_back(kv);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    unlink(path);
    fail("--scenario ", o.scenario, ": cannot start ", argv[0], ": ", std::strerror(rc));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream f(path);
  nlohmann::json j;
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && f && (f >> j, true);
  unlink(path);
  if (!ok || !j.contains("rows") || j["rows"].size() != 1)
    fail("--scenario ", o.scenario, ": the fresh-process run of case ", c.name, " failed (status ", status, ")");
  const auto& r = j["rows"][0];
  RealUseRow row = new_row(o.scenario, phase, c);
  row.T_min = r["T_min"], row.T_max = r["T_max"];
  row.steps = r["steps"], row.flops = r["flops"], row.seconds = r["seconds"], row.gflops = r["gflops"];
  row.step_ms_median = r["step_ms_median"], row.user_s = r["user_s"], row.sys_s = r["sys_s"];
  row.sys_share = r["sys_share"], row.minflt_per_step = r["minflt_per_step"];
  row.peak_rss_mib = r["peak_rss_mib"], row.rss_mib = r["rss_mib"];
  row.alloc_hits = r["alloc_hits"], row.alloc_partial = r["alloc_partial"], row.alloc_misses = r["alloc_misses"];
  row.alloc_evictions = r["alloc_evictions"], row.alloc_cached_mib = r["alloc_cached_mib"];
  row.alloc_fresh_mib_per_step = r["alloc_fresh_mib_per_step"];
  return row;
}

void add_target(RealUseReport& rep, std::string name, double value, double target, bool higher) {
  rep.summary.push_back({std::move(name), value, target, higher});
}
void add_info(RealUseReport& rep, std::string name, double value) {
  RealUseSummary s{std::move(name), value, 0, true};
  s.info = true;
  rep.summary.push_back(s);
}

double max_sys_share(const RealUseReport& rep) {
  double m = 0;
  for (const RealUseRow& r : rep.rows) m = std::max(m, r.sys_share);
  return m;
}

}  // namespace

RealUseReport run_real_use(const RealUseOptions& o) {
  if (o.steps < 1) fail("--steps must be at least 1, got ", o.steps);
  if (o.warmup < 0) fail("--warmup must be at least 0, got ", o.warmup);
  if (o.scenario != "changing-t" && o.scenario != "sequential" && o.scenario != "accumulate")
    fail("--scenario must be changing-t, sequential or accumulate, got '", o.scenario, "'");
  std::vector<Case> cases;
  for (const std::string& name : o.cases) cases.push_back(find_case(name));
  if (cases.empty()) {
    if (o.scenario == "sequential")
      cases = bench_cases();
    else
      cases.push_back(find_case("many-experts"));
  }
  for (Case& c : cases) c = with_shape_overrides(c, o.overrides, "--scenario");
  RealUseReport rep;
  rep.scenario = o.scenario;
  const alloc::Stats a = alloc::stats();
  rep.allocator = a.cap_bytes ? "engine (cache cap " + std::to_string(a.cap_bytes >> 20) + " MiB)"
                              : "C library (MOE_ALLOC_CACHE_MIB=0)";
  if (o.alone) {
    if (cases.size() != 1) fail("--alone runs one case, got ", cases.size());
    rep.rows.push_back(fixed_phase(o.scenario, "fresh-process", cases[0], o));
    return rep;
  }
  if (o.scenario == "changing-t") {
    for (const Case& c : cases) {
      RealUseRow fixed = fixed_phase("changing-t", "fixed-t", c, o);
      RealUseRow changing = changing_phase(c, o);
      // The RSS baseline: the fixed-T peak at the largest T the changing steps
      // may draw (1.25 T), in a fresh process; a few steps reach its peak.
      const int64_t hi = c.T * 5 / 4;
      RealUseRow at_max = fresh_process_row(c, o, "fixed-tmax", std::min(o.steps, 3), {"T=" + std::to_string(hi)});
      add_target(rep, c.name + ": changing_over_fixed_gflops", changing.gflops / fixed.gflops, 0.90, true);
      add_target(rep, c.name + ": peak_rss_changing_over_fixed_at_tmax",
                 changing.peak_rss_mib / at_max.peak_rss_mib, 1.15, false);
      add_info(rep, c.name + ": peak_rss_changing_over_fixed_at_t", changing.peak_rss_mib / fixed.peak_rss_mib);
      rep.rows.push_back(fixed);
      rep.rows.push_back(changing);
      rep.rows.push_back(at_max);
    }
  } else if (o.scenario == "accumulate") {
    for (const Case& c : cases) {
      RealUseRow fixed = fixed_phase("accumulate", "fixed-t", c, o);
      RealUseRow accum = accumulate_phase(c, o);
      add_target(rep, c.name + ": accumulate_over_fixed_gflops", accum.gflops / fixed.gflops, 0.90, true);
      rep.rows.push_back(fixed);
      rep.rows.push_back(accum);
    }
  } else {
    // Each case's fresh process runs right after its turn in this one, so a
    // load that changes during the run biases neither half.
    for (const Case& c : cases) {
      RealUseRow one = fixed_phase("sequential", "one-process", c, o);
      RealUseRow fresh = fresh_process_row(c, o, "fresh-process", o.steps, {});
      add_target(rep, c.name + ": one_process_over_fresh_gflops", one.gflops / fresh.gflops, 0.90, true);
      rep.rows.push_back(one);
      rep.rows.push_back(fresh);
    }
  }
  add_target(rep, "max_sys_share", max_sys_share(rep), 0.05, false);
  return rep;
}

std::string format_real_use(const RealUseReport& rep) {
  std::ostringstream os;
  char buf[512];
  os << "scenario: " << rep.scenario << "; allocator: " << rep.allocator << "\n";
  std::snprintf(buf, sizeof buf, "%-14s %-14s %-11s %5s %9s %9s %7s %9s %9s %9s %10s %s\n", "case", "phase", "T",
                "steps", "GFLOP/s", "step ms", "sys %", "flt/step", "peak MiB", "RSS MiB", "fresh MiB/st",
                "hit/part/miss/evict");
  os << buf;
  for (const RealUseRow& r : rep.rows) {
    std::string t = r.T_min == r.T_max ? std::to_string(r.T_min)
                                       : std::to_string(r.T_min) + ".." + std::to_string(r.T_max);
    std::string hme = std::to_string(r.alloc_hits) + "/" + std::to_string(r.alloc_partial) + "/" +
                      std::to_string(r.alloc_misses) + "/" + std::to_string(r.alloc_evictions);
    std::snprintf(buf, sizeof buf, "%-14s %-14s %-11s %5d %9.1f %9.1f %7.2f %9.0f %9.0f %9.0f %10.1f %s\n",
                  r.case_name.c_str(), r.phase.c_str(), t.c_str(), r.steps, r.gflops, r.step_ms_median,
                  100.0 * r.sys_share, r.minflt_per_step, r.peak_rss_mib, r.rss_mib, r.alloc_fresh_mib_per_step,
                  hme.c_str());
    os << buf;
  }
  for (const RealUseSummary& s : rep.summary) {
    if (s.info) {
      std::snprintf(buf, sizeof buf, "%s: %.3f (for information)\n", s.name.c_str(), s.value);
      os << buf;
      continue;
    }
    std::snprintf(buf, sizeof buf, "%s: %.3f (target %s %.2f: %s)\n", s.name.c_str(), s.value,
                  s.higher_is_better ? ">=" : "<=", s.target, s.met() ? "met" : "NOT met");
    os << buf;
  }
  return os.str();
}

std::string real_use_json(const RealUseReport& rep) {
  nlohmann::ordered_json j;
  j["scenario"] = rep.scenario;
  j["allocator"] = rep.allocator;
  j["rows"] = nlohmann::ordered_json::array();
  for (const RealUseRow& r : rep.rows) {
    j["rows"].push_back({{"scenario", r.scenario},
                         {"phase", r.phase},
                         {"case", r.case_name},
                         {"T_min", r.T_min},
                         {"T_max", r.T_max},
                         {"D", r.D},
                         {"F", r.F},
                         {"E", r.E},
                         {"K", r.K},
                         {"steps", r.steps},
                         {"flops", r.flops},
                         {"seconds", r.seconds},
                         {"gflops", r.gflops},
                         {"step_ms_median", r.step_ms_median},
                         {"user_s", r.user_s},
                         {"sys_s", r.sys_s},
                         {"sys_share", r.sys_share},
                         {"minflt_per_step", r.minflt_per_step},
                         {"peak_rss_mib", r.peak_rss_mib},
                         {"rss_mib", r.rss_mib},
                         {"alloc_hits", r.alloc_hits},
                         {"alloc_partial", r.alloc_partial},
                         {"alloc_misses", r.alloc_misses},
                         {"alloc_evictions", r.alloc_evictions},
                         {"alloc_fresh_mib_per_step", r.alloc_fresh_mib_per_step},
                         {"alloc_cached_mib", r.alloc_cached_mib}});
  }
  j["summary"] = nlohmann::ordered_json::array();
  for (const RealUseSummary& s : rep.summary)
    j["summary"].push_back({{"name", s.name},
                            {"value", s.value},
                            {"target", s.target},
                            {"higher_is_better", s.higher_is_better},
                            {"met", s.info ? nlohmann::ordered_json() : nlohmann::ordered_json(s.met())}});
  return j.dump(2) + "\n";
}

// VmRSS of this process from /proc/self/status, in MiB (0 where unreadable).
double rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::istringstream is(line.substr(6));
    double kib = 0;
    is >> kib;
    return kib / 1024.0;
  }
  return 0;
}

}  // namespace moe::bench
