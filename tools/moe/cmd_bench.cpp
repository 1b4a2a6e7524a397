// moe bench [--case NAME]... [--dtype bf16|f32] [--iters N] [--warmup N] [--json FILE]
// Checks each variant bit for bit against its baseline, then times it
// (docs/benchmarks.md). Exits 1 when any check fails.
// moe bench --dist [--variant NAME]... [--tokens N] [--iters N] [--warmup N] [--json FILE] [key=value ...]
// (under mpirun): the distributed layer's table (bench_dist.cpp).
// moe bench --scenario changing-t|sequential|accumulate [--case NAME]... [--steps N] [T=..] [D=..] ...
// real use: changing T, cases one after another, accumulated gradients (src/bench/real_use.h).
#include <cstdio>
#include <utility>

#include "bench/harness.h"
#include "bench/real_use.h"
#include "bench_dist.h"
#include "cli_util.h"
#include "commands.h"
#include "io/atomic_file.h"

namespace moe::cli {
namespace {
struct BenchArgs {
  std::vector<std::string> cases;
  std::string dtype = "bf16", weight_dtype, json;
  int iters = 5, warmup = 1;
  uint64_t seed = 0;
  bool list = false;
  bool dist = false;
  BenchDistArgs d;
  std::string scenario;
  int steps = 20;
  bool alone = false;
};

void run_scenario(const BenchArgs& a) {
  if (a.dist || !a.d.variants.empty()) fail("--scenario does not take --dist or --variant");
  bench::RealUseOptions o;
  o.scenario = a.scenario, o.cases = a.cases, o.overrides = a.d.overrides;
  o.dtype = a.dtype == "f32" ? DType::f32 : DType::bf16;
  o.steps = a.steps, o.warmup = a.warmup, o.seed = a.seed, o.alone = a.alone;
  if (!a.json.empty()) check_output_dir(a.json, "--json");
  bench::RealUseReport r = bench::run_real_use(o);
  std::fputs(bench::format_real_use(r).c_str(), stdout);
  if (!a.json.empty()) {
    write_file_atomic(a.json, bench::real_use_json(r));
    std::printf("wrote %s\n", a.json.c_str());
  }
}

void list_cases() {
  for (const bench::Case& c : bench::all_cases())
    std::printf("%-20s T=%-5lld D=%-5lld F=%-5lld E=%-4lld K=%-2lld %s%s\n", c.name.c_str(), (long long)c.T,
                (long long)c.D, (long long)c.F, (long long)c.E, (long long)c.K,
                c.test_problem ? "[test] " : c.model ? "[model] " : "", c.description.c_str());
}

void run_bench_cmd(const BenchArgs& a) {
  if (!a.scenario.empty()) return run_scenario(a);
  if (a.dist) {
    BenchDistArgs d = a.d;
    d.json = a.json, d.iters = a.iters, d.warmup = a.warmup, d.seed = a.seed, d.list = a.list;
    return run_bench_dist(d);
  }
  if (!a.d.variants.empty()) fail("--variant needs --dist");
  if (a.list) return list_cases();
  bench::BenchOptions o;
  o.cases = a.cases;
  o.dtype = a.dtype == "f32" ? DType::f32 : DType::bf16;
  if (!a.weight_dtype.empty()) o.weight_dtype = a.weight_dtype == "f32" ? DType::f32 : DType::bf16;
  o.iters = a.iters, o.warmup = a.warmup, o.seed = a.seed, o.overrides = a.d.overrides;
  if (!a.json.empty()) check_output_dir(a.json, "--json");
  bool header = false;  // printed with the first row, so an argument error comes alone
  auto rows = bench::run_bench(o, [&header](const bench::BenchResult& r) {
    if (!std::exchange(header, true)) {
      std::fputs(bench::format_setup_line(r.dense).c_str(), stdout);
      if (const std::string w = DenseRunner::spin_warning(); !w.empty() && r.dense.impl == "onednn")
        std::fprintf(stderr, "moe: warning: bench: %s\n", w.c_str());
      std::fputs(bench::format_table_header().c_str(), stdout);
    }
    std::fputs(bench::format_table_row(r).c_str(), stdout);
    std::fflush(stdout);
    if (!r.note.empty()) std::fprintf(stderr, "moe: note: bench: %s\n", r.note.c_str());
  });
  if (!a.json.empty()) {
    write_file_atomic(a.json, bench::results_json(rows));
    std::printf("wrote %s\n", a.json.c_str());
  }
  if (!bench::all_checks_passed(rows)) {
    std::fprintf(stderr,
                 "moe: error: bench: a variant does not match its baseline bit for bit (FAIL rows above)\n");
    set_exit_code(1);
  }
}
}  // namespace

void add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand(
      "bench",
      "Benchmark the layer on the registry's cases: every variant (reference / fused kernels, split layout)\n"
      "is checked bit for bit against its baseline (PASS/FAIL), then timed forward and forward+backward,\n"
      "next to a dense GEMM baseline and memcpy measured in the same run. See docs/benchmarks.md.");
  c->add_option("--case", a->cases, "Case name (repeatable; default: every bench case). --list shows them")
      ->allow_extra_args(false);  // one name per --case, so `--case NAME T=64` leaves T=64 an override
  c->add_option("--dtype", a->dtype, "Activation dtype")->check(CLI::IsMember({"bf16", "f32"}));
  c->add_option(
       "--weight-dtype", a->weight_dtype,
       "Stored weight dtype (default: the activation dtype); f32 with --dtype bf16 adds the per-step cast")
      ->check(CLI::IsMember({"bf16", "f32"}));
  c->add_option("--iters", a->iters, "Timed iterations per variant (default 5)");
  c->add_option("--warmup", a->warmup, "Untimed iterations after the check run (default 1)");
  c->add_option("--seed", a->seed, "Seed of the inputs (weights come from the case)");
  c->add_option("--json", a->json, "Write the results as JSON (SPEC.md §7) to this file");
  c->add_flag("--list", a->list, "List the cases (with --dist: the variants) and exit");
  c->add_flag("--dist", a->dist,
              "The distributed layer's table under mpirun (docs/benchmarks.md, Distributed)");
  c->add_option("--variant", a->d.variants, "--dist: run only these variants (and their baselines)");
  c->add_option("--probe-mb", a->d.probe_mb,
                "--dist: only time an all-to-all of this many MB per rank (link probe)");
  c->add_option("--probe-calls", a->d.probe_calls,
                "--dist: split the probe's bytes over this many all-to-alls");
  c->add_option("--probe-pattern", a->d.probe_pattern,
                "--dist: the probe's traffic: all-to-all (default), or pairs (ranks 2i and 2i+1 all-gather "
                "MB each, every pair at once: one stream each way per pair)")
      ->check(CLI::IsMember({"all-to-all", "pairs"}));
  c->add_option("--speed-probe", a->d.speed_probe,
                "--dist: time a fixed one-thread step on every rank at once, N steps before and after each "
                "variant (the JSON's speed_probe_ms, for moe plan --probe-ms)");
  c->add_option("--trace-dir", a->d.trace_dir,
                "--dist: write each variant's last timed step as DIR/<variant>.json (Chrome trace)");
  c->add_option("--tokens", a->d.tokens, "--dist: tokens per rank (default 256)");
  c->add_option(
      "overrides", a->d.overrides,
      "--dist: key=value overrides of the layer (D=1024 F=512 E=8 K=2 bf16); otherwise the cases' shape:\n"
      "T= D= F= E= K= (e.g. --case mixtral-8x7b T=64)");
  c->add_option("--scenario", a->scenario,
                "Real use (docs/benchmarks.md, Real use): changing T, cases in sequence, accumulation")
      ->check(CLI::IsMember({"changing-t", "sequential", "accumulate"}));
  c->add_option("--steps", a->steps, "--scenario: timed steps per phase (default 20)");
  c->add_flag("--alone", a->alone, "--scenario: run the one --case here at fixed T (the fresh-process half of sequential, the 1.25 T baseline of changing-t)");
  c->callback([a] { run_bench_cmd(*a); });
}

}  // namespace moe::cli
