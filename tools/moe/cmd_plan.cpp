// moe plan: the model of scale (docs/distributed.md, "Model of scale").
//   moe plan --calibrate [--out FILE] [--tiny] [--iters N]       kernel rates of this machine
//   mpirun -np 2 moe plan --calibrate --rates IN --out FILE      + the shared-memory link's α, β
//   mpirun -np N moe plan --calibrate --rates IN --out FILE      + the contention of N ranks on this host
//   moe plan --rates FILE [--cluster SPEC] (--case NAME | --config C [key=value ...] | --bench-variant NAME)
//            [--tokens N] [--top N] [--probe-ms MS] [--json FILE]  rank the layouts, say why the first wins
//   moe plan --rates FILE --sweep [--json FILE]                   8 to 1024 hosts at 10 and 100 Gbit/s
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/cases.h"
#include "bench/dist_bench.h"
#include "cli_util.h"
#include "commands.h"
#include "io/atomic_file.h"
#include "plan/bench_rows.h"
#include "plan/calibrate.h"
#include "plan/from_config.h"
#include "plan/ranking.h"

namespace moe::cli {
namespace {

struct PlanArgs {
  bool calibrate = false, tiny = false, sweep = false, layout_from_config = false, uniform_routing = false;
  std::string weight_dtype;
  std::string out, rates, cluster, case_name, config, bench_variant, json, a2a = "flat";
  std::vector<std::string> overrides;
  int64_t tokens = 0;
  int iters = 3, top = 12;
  double probe_ms = 0;
};

void run_calibrate(const PlanArgs& a) {
  if (a.out.empty()) fail("--calibrate needs --out FILE (where the rates go)");
  check_output_dir(a.out, "--out");
  Communicator& w = world();
  if (w.size() > 1 && a.rates.empty())
    fail(
        "--calibrate under mpirun measures only the link: give --rates FILE (a single-process calibration) "
        "to add it to");
  plan::Rates r;
  plan::CalibrateOptions o;
  o.iters = a.iters;
  o.log = [](const std::string& s) { std::printf("%s\n", s.c_str()), std::fflush(stdout); };
  if (a.tiny) {
    o.shapes.push_back({"tiny", 64, 64, 32, 8, 2, DType::bf16, DType::f32, {}, 0});
    o.iters = 1;
  } else {
    o.shapes.push_back({"dist-bench", 1024, 1024, 512, 8, 2, DType::bf16, DType::f32, {}, 0});
    o.shapes.push_back({"many-experts", 512, 1024, 512, 128, 8, DType::bf16, DType::f32, {}, 0});
  }
  if (a.case_name.size()) {
    const bench::Case& c = bench::find_case(a.case_name);
    o.shapes.push_back({c.name, c.T, c.D, c.F, c.E, c.K, DType::bf16, DType::f32, {}, 0});
  }
  if (w.rank() == 0)
    std::printf("moe plan --calibrate: %zu shape(s), %d iters, %d rank(s)\n", o.shapes.size(), o.iters,
                w.size());
  run_collectively(w, [&] { r = plan::calibrate(o, w); });
  const bool cpu_measured = w.size() > 1 && r.comm_cpu_ns_per_byte > 0;  // one process writes the default
  if (w.size() > 1 && w.rank() == 0) {  // keep the kernels of the single-process calibration
    plan::Rates base = plan::read_rates(a.rates);
    // The link's α and β between two ranks (-np 2), or from any N when the file has none; the
    // contention row of this N ranks per core is added (replacing one measured at the same N).
    if (w.size() == 2 || !base.intra_measured) base.intra = r.intra, base.intra_measured = r.intra_measured;
    for (const plan::Contention& c : r.contention) base.set_contention(c);
    if (r.comm_cpu_ns_per_byte > 0) base.comm_cpu_ns_per_byte = r.comm_cpu_ns_per_byte;
    r = base;
  }
  if (w.rank() != 0) return;
  write_file_atomic(a.out, plan::rates_json(r));
  for (const plan::Contention& c : r.contention) {
    std::printf("contention at %.2f ranks per core: wait after compute", c.ranks_per_core);
    for (size_t i = 0; i < c.compute_s.size(); ++i)
      std::printf(" %.2f ms: %.0f us;", c.compute_s[i] * 1e3, c.wait_s[i] * 1e6);
    std::printf(" side_busy %.0f us\n", c.side_busy_s * 1e6);
  }
  std::printf("intra link: %.2f GB/s, %.2f us (%s)\n", r.intra.bw_Bps / 1e9, r.intra.lat_s * 1e6,
              r.intra_measured ? "measured" : "derived from memcpy; run under mpirun -np 2 to measure");
  std::printf("network stack CPU: %.2f ns per byte sent between hosts (%s)\nwrote %s\n", r.comm_cpu_ns_per_byte,
              cpu_measured ? "measured by this run: every rank on a host of its own"
                                  : "the rates file's: this run did not measure it (one rank per host under mpirun does)",
              a.out.c_str());
}

plan::Cluster cluster_of(const std::string& spec) {
  if (spec.empty()) {
    plan::Cluster c;
    c.cores = std::max(1u, std::thread::hardware_concurrency());
    return c;
  }
  return plan::parse_cluster(spec);
}

// The layer (and a fixed layout when the input names one).
struct Input {
  plan::LayerShape L;
  bool fixed = false;
  plan::Layout layout;
};

Input input_of(const PlanArgs& a, const plan::Cluster& cl) {
  const int given = int(!a.case_name.empty()) + int(!a.config.empty()) + int(!a.bench_variant.empty());
  if (given != 1) fail("moe plan: give exactly one of --case NAME, --config FILE, --bench-variant NAME");
  const plan::A2AAlgo algo = a.a2a == "hierarchical" ? plan::A2AAlgo::hierarchical : plan::A2AAlgo::flat;
  Input in;
  if (!a.case_name.empty()) {
    const bench::Case& c = bench::find_case(a.case_name);
    in.L = plan::shape_of(bench::case_config(c, DType::bf16), a.tokens > 0 ? a.tokens : c.T, c.name);
  } else if (!a.config.empty()) {
    // The config's own rules only: its mesh is checked against the described cluster, not this world.
    const Config cfg = load_config(a.config, a.overrides).config;
    in.L = plan::shape_of(cfg, a.tokens > 0 ? a.tokens : 256, a.config);
    if (a.layout_from_config) in.fixed = true, in.layout = plan::layout_of(cfg, cl.ranks(), algo);
  } else {
    const Config base = bench::dist_bench_config(a.overrides);
    for (const bench::DistVariant& v : bench::dist_variants())
      if (v.name == a.bench_variant) {
        const Config cfg = bench::dist_variant_config(base, v);
        in.L = plan::shape_of(cfg, a.tokens > 0 ? a.tokens : 256, "moe bench --dist");
        in.fixed = true;
        in.layout = plan::layout_of(cfg, v.ranks(), algo);
        if (!a.uniform_routing && in.layout.expert > 1 && in.layout.chunks <= in.L.T) {
          // The bench's own routing (its inputs and router, seed 0): the busiest rank's rows.
          const auto rows =
              plan::bench_expert_rows(cfg, v.ranks(), in.layout.expert, in.L.T, in.layout.chunks, 0);
          in.L.busiest_chunk_rows.assign(size_t(in.layout.chunks), 0.0);
          std::string text;
          for (size_t r = 0; r < rows.size(); ++r) {
            double total = 0;
            text += (r ? "; rank " : "rank ") + std::to_string(r) + ":";
            for (size_t c = 0; c < rows[r].size(); ++c) {
              in.L.busiest_chunk_rows[c] = std::max(in.L.busiest_chunk_rows[c], double(rows[r][c]));
              total += double(rows[r][c]);
              text += " " + std::to_string(rows[r][c]);
            }
            in.L.busiest_step_rows = std::max(in.L.busiest_step_rows, total);
          }
          std::printf("the bench's routing, expert rows per chunk: %s (uniform: %lld)\n", text.c_str(),
                      (long long)(in.L.T / in.layout.chunks * in.L.K));
        }
      }
    if (!in.fixed)
      fail("--bench-variant ", a.bench_variant, ": unknown (moe bench --dist --list shows them)");
  }
  if (!a.weight_dtype.empty()) in.L.weight_dtype = a.weight_dtype == "f32" ? DType::f32 : DType::bf16;
  if (in.fixed) {
    const std::string why = plan::check_layout(in.L, in.layout, cl);
    if (!why.empty()) fail("moe plan: layout ", in.layout.name(), " does not fit: ", why);
  }
  return in;
}

void run_plan(const PlanArgs& a) {
  if (a.rates.empty())
    fail("moe plan needs --rates FILE (make one with: moe plan --calibrate --out rates.json)");
  if (!a.json.empty()) check_output_dir(a.json, "--json");
  const plan::Cluster cl = cluster_of(a.cluster);  // a bad cluster string fails before anything is read
  const plan::Rates r = plan::read_rates(a.rates);
  plan::ModelOptions mo;
  if (a.probe_ms != 0) {
    if (!(a.probe_ms > 0)) fail("--probe-ms must be > 0 (got ", a.probe_ms, ")");
    if (a.sweep) fail("--probe-ms is the speed probe of one measured run: it does not apply to --sweep");
    if (r.probe_ms <= 0)
      fail("--probe-ms: ", a.rates,
           " has no speed_probe_ms (calibrated before the probe existed): run moe plan --calibrate again");
    mo.probe_ms = a.probe_ms;
  }
  nlohmann::json doc;
  if (a.sweep) {
    std::vector<plan::LayerShape> layers;
    for (const char* n : {"seed-mixtral", "many-experts"}) {
      const bench::Case& c = bench::find_case(n);
      layers.push_back(
          plan::shape_of(bench::case_config(c, DType::bf16), a.tokens > 0 ? a.tokens : c.T, c.name));
    }
    plan::SweepOptions o;
    std::printf(
        "moe plan --sweep: weak scaling, tokens per rank fixed (%lld); %d ranks per host, %.0f cores per "
        "host; "
        "inter-host latency 20 us at 10 Gbit/s, 5 us at 100 Gbit/s; intra link from %s\n",
        (long long)layers[0].T, o.ranks_per_host, o.cores, a.rates.c_str());
    const auto rows = plan::sweep(layers, r, o);
    std::fputs(plan::format_sweep(rows).c_str(), stdout);
    for (const auto& row : rows)
      doc["sweep"].push_back({{"layer", row.layer},
                              {"hosts", row.hosts},
                              {"inter_gbit", row.inter_gbit},
                              {"tokens_per_s", row.tokens_per_s},
                              {"gain", row.gain},
                              {"stops_paying", row.stops_paying},
                              {"best", nlohmann::json::parse(plan::prediction_json(row.best, false))}});
  } else {
    plan::Cluster shown = cl;
    if (shown.intra.bw_Bps == 0) shown.intra = r.intra;
    const Input in = input_of(a, cl);
    std::printf("moe plan: %s\nlayer %s: T=%lld per rank, D=%lld F=%lld E=%lld K=%lld %s\n",
                plan::format_cluster(shown).c_str(), in.L.name.c_str(), (long long)in.L.T, (long long)in.L.D,
                (long long)in.L.F, (long long)in.L.E, (long long)in.L.K, dtype_name(in.L.dtype));
    std::vector<plan::Layout> cands =
        in.fixed ? std::vector<plan::Layout>{in.layout} : plan::candidate_layouts(in.L, cl);
    if (cands.empty())
      fail("moe plan: no layout of ", cl.ranks(), " ranks fits this layer (E=", in.L.E, ", D=", in.L.D, ")");
    if (mo.probe_ms > 0 && in.fixed)
      std::printf(
          "paired speed probe: %.2f ms during the measurement (the calibration's %.2f ms alone): compute "
          "%.3fx the calibrated rates, against %.3fx without the probe\n",
          mo.probe_ms, r.probe_ms, plan::compute_slowdown(in.L, in.layout, cl, r, mo),
          plan::compute_slowdown(in.L, in.layout, cl, r, {}));
    const auto ranked = plan::rank_layouts(in.L, cl, r, cands, mo);
    std::printf("%-48s %10s %10s %10s %10s\n", "layout (predicted)", "step ms", "compute", "exposed", "comm");
    for (size_t i = 0; i < ranked.size() && int(i) < a.top; ++i)
      std::fputs(plan::format_prediction(ranked[i]).c_str(), stdout);
    if (int(ranked.size()) > a.top) std::printf("... %zu more (--top N)\n", ranked.size() - size_t(a.top));
    std::fputs(plan::explain_winner(ranked).c_str(), stdout);
    doc["cluster"] = plan::format_cluster(shown);
    doc["layer"] = {{"name", in.L.name},
                    {"T", in.L.T},
                    {"D", in.L.D},
                    {"F", in.L.F},
                    {"E", in.L.E},
                    {"K", in.L.K},
                    {"dtype", dtype_name(in.L.dtype)}};
    doc["why"] = plan::explain_winner(ranked);
    if (mo.probe_ms > 0) doc["probe_ms"] = mo.probe_ms, doc["rates_probe_ms"] = r.probe_ms;
    const plan::Prediction full = plan::predict_step(in.L, ranked[0].layout, cl, r, mo);
    for (size_t i = 0; i < ranked.size(); ++i)
      doc["ranked"].push_back(
          nlohmann::json::parse(plan::prediction_json(i == 0 ? full : ranked[i], i == 0)));
  }
  if (!a.json.empty()) {
    write_file_atomic(a.json, doc.dump(2) + "\n");
    std::printf("wrote %s\n", a.json.c_str());
  }
}

}  // namespace

void add_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* c = app.add_subcommand(
      "plan",
      "Model of scale: predict the step time of the distributed layer on a described cluster (compute per "
      "op,\n"
      "alpha-beta cost of every collective per algorithm, exposed time under each offload plan), rank the\n"
      "layouts and say why the first wins. Rates come from --calibrate. See docs/distributed.md.");
  c->add_flag("--calibrate", a->calibrate,
              "Measure this machine's kernel rates into --out (under mpirun -np 2: the link too)");
  c->add_option("--out", a->out, "--calibrate: the rates file to write");
  c->add_flag("--tiny", a->tiny, "--calibrate: one tiny shape, one iteration (a smoke test)");
  c->add_option("--iters", a->iters, "--calibrate: timed steps per shape (default 3)");
  c->add_option("--rates", a->rates, "Kernel rates (docs/formats.md, Plan rates)");
  c->add_option(
      "--cluster", a->cluster,
      "hosts=N,cores=C,ranks_per_host=R,inter_bw=10Gbit,inter_lat=20us[,intra_bw=..,intra_lat=..,threads=N] "
      "(default: this machine, one rank)");
  c->add_option("--case", a->case_name, "The layer of a bench case (moe bench --list)");
  c->add_option("--config", a->config, "The layer of a YAML config (key=value overrides after it)");
  c->add_flag("--layout-from-config", a->layout_from_config,
              "--config: predict only the config's own layout");
  c->add_option("--bench-variant", a->bench_variant, "A moe bench --dist variant: its layer and layout");
  c->add_flag(
      "--uniform-routing", a->uniform_routing,
      "--bench-variant: take the routing as uniform (default: the bench's own, the busiest rank's rows)");
  c->add_option("--a2a", a->a2a, "All-to-all algorithm of a fixed layout")
      ->check(CLI::IsMember({"flat", "hierarchical"}));
  c->add_option("--weight-dtype", a->weight_dtype,
                "Stored weight dtype of the layer (a case's default: f32; moe bench's: bf16)")
      ->check(CLI::IsMember({"bf16", "f32"}));
  c->add_option("--tokens", a->tokens,
                "Tokens per rank (default: the case's T; 256 for a config or variant)");
  c->add_option("--top", a->top, "Ranked layouts to print (default 12)");
  c->add_flag("--sweep", a->sweep,
              "Predictions from 8 to 1024 hosts at 10 and 100 Gbit/s (seed-mixtral, many-experts)");
  c->add_option("--probe-ms", a->probe_ms,
                "The speed probe of the measured run (moe bench --dist --speed-probe): predict at the "
                "machine's speed then");
  c->add_option("--json", a->json, "Write the predictions as JSON");
  c->add_option("overrides", a->overrides, "key=value overrides of --config or of the --bench-variant layer");
  c->callback([a] {
    if (a->calibrate) return run_calibrate(*a);
    run_plan(*a);
  });
}

}  // namespace moe::cli
