// `moe bench --dist` (bench_dist.h): rank 0 prints the table as rows arrive
// and writes the JSON; an error on any rank takes the job down.
#include "bench_dist.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "bench/dist_bench.h"
#include "cli_util.h"
#include "io/atomic_file.h"
#include "moe/isa.h"
#include "moe/watchdog.h"

namespace moe::cli {
namespace {

void list_variants() {
  for (const bench::DistVariant& v : bench::dist_variants())
    std::printf("%-24s ranks %d  %s\n", v.name.c_str(), v.ranks(), v.what.c_str());
}

void probe(const BenchDistArgs& a, Communicator& w) {
  const bool pairs = a.probe_pattern == "pairs";
  const int iters = std::max(a.iters, 1), calls = std::max(a.probe_calls, 1);
  const int64_t bytes = int64_t(a.probe_mb * 1e6);
  bench::ProbeResult r =
      pairs ? bench::probe_pairs(w, bytes, iters, calls) : bench::probe_all_to_all(w, bytes, iters, calls);
  if (w.rank() == 0)
    std::printf("probe: %d %s, %d ranks, %.2f MB out of each rank: median %.2f ms = %.0f Mbit/s per rank; "
                "polite waits: median %.2f ms, machine busy %.2f core-ms per iteration\n",
                calls, pairs ? "all-gather(s) in pairs of ranks" : "all-to-all(s)", w.size(),
                double(r.bytes_out) / 1e6, r.median_ms, r.mbit_per_s, r.polite_median_ms, r.busy_core_ms);
}

void run(const BenchDistArgs& a, Communicator& w) {
  if (a.probe_mb > 0) return probe(a, w);
  bench::DistBenchOptions o;
  o.base = bench::dist_bench_config(a.overrides);
  apply_collective_timeout(o.base.collective_timeout_s);
  apply_collective_liveness(o.base.collective_liveness_s);
  o.tokens = a.tokens, o.iters = a.iters, o.warmup = a.warmup, o.seed = a.seed, o.variants = a.variants;
  o.trace_dir = a.trace_dir;
  o.speed_probe_iters = a.speed_probe;
  if (a.speed_probe < 0) fail("--speed-probe must be >= 0 (got ", a.speed_probe, ")");
  if (o.tokens < 1) fail("--tokens must be >= 1 (got ", o.tokens, ")");
  if (!a.json.empty()) check_output_dir(a.json, "--json");
  const bool root = w.rank() == 0;
  if (root && !a.trace_dir.empty()) ensure_directory(a.trace_dir, "--trace-dir");
  if (root) {
    std::printf(
        "moe bench --dist: T=%lld per rank, D=%lld F=%lld E=%lld K=%lld dtype=%s, %d rank(s), %d iters, "
        "kernel level %s\n",
        (long long)o.tokens, (long long)o.base.emb_dim, (long long)o.base.moe_mlp_dim,
        (long long)o.base.num_experts, (long long)o.base.num_experts_per_tok, dtype_name(o.base.dtype),
        w.size(), o.iters, isa_name(active_isa()));
    std::fflush(stdout);
  }
  bool header = false;  // printed with the first row, so an unknown variant's error comes alone
  auto rows = bench::run_dist_bench(o, w, [&header](const bench::DistResult& r) {
    if (!std::exchange(header, true)) std::fputs(bench::format_dist_header().c_str(), stdout);
    std::fputs(bench::format_dist_row(r).c_str(), stdout);
    std::fflush(stdout);
  });
  if (root && !a.json.empty()) {
    write_file_atomic(a.json, bench::dist_results_json(rows));
    std::printf("wrote %s\n", a.json.c_str());
  }
}

}  // namespace

void run_bench_dist(const BenchDistArgs& a) {
  if (a.list) return list_variants();
  Communicator& w = world();
  run_collectively(w, [&] { run(a, w); });
}

}  // namespace moe::cli
