// moe check [--json FILE] [--variant NAME]... [--tokens N] [--seed N] [--list] [key=value ...]
// The gradient-equivalence harness (docs/check.md): every variant's
// distributed step against the single-process layer on the same weights and
// inputs. Run it under mpirun (-np 4 runs every variant); a single process
// runs what fits on one rank. Exits 1 when a variant misses its requirement.
#include <cstdio>

#include "bench/cases.h"
#include "check/harness.h"
#include "check/report.h"
#include "check/variants.h"
#include "cli_util.h"
#include "commands.h"
#include "io/atomic_file.h"
#include "moe/watchdog.h"

namespace moe::cli {
namespace {

struct CheckArgs {
  std::string json;
  std::vector<std::string> variants, overrides;
  int64_t tokens = 0;  // 0: the case's T
  uint64_t seed = 0;
  bool list = false;
};

// The built-in problem: the registry's `tiny` case (Mixtral-like E=8, K=2,
// D=64, F=32, T=64, bf16) with both aux losses on, so the router gradient
// has every term. key=value overrides apply on top.
Config base_config(const std::vector<std::string>& overrides) {
  const bench::Case& c = bench::find_case("tiny");
  std::string yaml = "num_experts: " + std::to_string(c.E) + "\nnum_experts_per_tok: " + std::to_string(c.K) +
                     "\nemb_dim: " + std::to_string(c.D) + "\nmoe_mlp_dim: " + std::to_string(c.F) +
                     "\ndtype: bf16\nload_balance_loss_weight: 0.01\nrouter_z_loss_weight: 0.001\n";
  Config cfg = parse_config(yaml, "<moe check>", overrides).config;
  refuse_f64(cfg, "<moe check>");
  return cfg;
}

void list_variants() {
  for (const check::VariantSpec& v : check::all_variants())
    std::printf("%-22s ranks %d  %s\n", v.name.c_str(), v.ranks(), v.what.c_str());
}

bool all_pass(const std::vector<check::VariantReport>& reports) {
  for (const auto& r : reports)
    if (!r.skipped && !r.pass) return false;
  return true;
}

// Rank 0 runs, prints and writes; every rank learns the verdict (uncounted broadcast).
void run(const CheckArgs& a, Communicator& w) {
  check::CheckOptions o;
  o.base = base_config(a.overrides);
  apply_collective_timeout(o.base.collective_timeout_s);
  apply_collective_liveness(o.base.collective_liveness_s);
  o.tokens = a.tokens > 0 ? a.tokens : bench::find_case("tiny").T;
  o.seed = a.seed, o.variants = a.variants;
  if (!a.json.empty()) check_output_dir(a.json, "--json");
  const bool root = w.rank() == 0;
  if (root) {
    std::printf("moe check: T=%lld D=%lld F=%lld E=%lld K=%lld dtype=%s, %d rank(s)\n", (long long)o.tokens,
                (long long)o.base.emb_dim, (long long)o.base.moe_mlp_dim, (long long)o.base.num_experts,
                (long long)o.base.num_experts_per_tok, dtype_name(o.base.dtype), w.size());
    std::fputs(check::format_table_header().c_str(), stdout);
    std::fflush(stdout);
  }
  auto reports = check::run_check(o, w, [](const check::VariantReport& r) {
    std::fputs(check::format_table_row(r).c_str(), stdout);
    std::fflush(stdout);
  });
  int ok = root ? all_pass(reports) : 0;
  if (root && !a.json.empty()) write_file_atomic(a.json, check::reports_json(reports));
  if (root && w.size() == 1) std::printf("(multi-rank variants need mpirun: mpirun -np 4 moe check)\n");
  w.broadcast(&ok, sizeof ok, 0);
  if (root) std::printf("moe check: %s\n", ok ? "every variant run meets its requirement" : "FAILED");
  if (!ok) set_exit_code(1);
}

void run_check_cmd(const CheckArgs& a) {
  if (a.list) return list_variants();
  Communicator& w = world();
  run_collectively(w, [&] { run(a, w); });
}

}  // namespace

void add_check(CLI::App& app) {
  auto a = std::make_shared<CheckArgs>();
  CLI::App* c = app.add_subcommand(
      "check",
      "Gradient equivalence: each parallel variant's step against the single-process layer\n"
      "(loss, y, every gradient; collective counts). Run under mpirun -np 4 for every variant.");
  c->add_option("--json", a->json, "Write the results as JSON (SPEC.md §7) to this file");
  c->add_option("--variant", a->variants, "Run only these variants (and their counterparts); see --list");
  c->add_option("--tokens", a->tokens, "Global tokens T (default 64)");
  c->add_option("--seed", a->seed, "Seed of the weights and inputs (default 0)");
  c->add_flag("--list", a->list, "List the variants and exit");
  c->add_option("overrides", a->overrides, "key=value config overrides of the built-in layer");
  c->callback([a] { run_check_cmd(*a); });
}

}  // namespace moe::cli
