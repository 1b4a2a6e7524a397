// `moe validate CONFIG [key=value ...] [--topology SPEC]`: resolve a config
// exactly as a run would and check it against a target (this machine, or the
// one --topology describes) with the same code as a real run (check_target).
// Valid: prints the resolved table, the target and the offload plan to
// stdout, exits 0. Invalid: prints every problem to stderr ("moe: error:
// ..."), exits 1.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "moe/config.h"
#include "moe/topology.h"

namespace moe::cli {
namespace {

struct ValidateArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string topology;  // "" = this machine
};

void report_problems(const std::string& path, const std::vector<std::string>& problems) {
  for (const auto& p : problems) std::fprintf(stderr, "moe: error: %s\n", p.c_str());
  std::fprintf(stderr, "moe: config %s is invalid (%zu problem%s)\n", path.c_str(), problems.size(),
               problems.size() == 1 ? "" : "s");
  set_exit_code(1);
}

// The target, resolved config table and offload plan of a valid config.
void print_valid(const ValidateArgs& args, const LoadedConfig& loaded, const TargetCheck& chk) {
  std::fputs(format_config_table(loaded.table).c_str(), stdout);
  std::printf("\ntarget: %s%s\n", chk.topology.describe().c_str(),
              args.topology.empty() ? " (this machine; see --topology)" : "");
  std::fputs(format_offload_plan(chk.offload, chk.capability).c_str(), stdout);
  for (size_t i = chk.offload.warnings.size(); i < chk.warnings.size(); ++i)
    std::printf("  warning: %s\n", chk.warnings[i].c_str());
  std::printf("config %s is valid\n", args.config_path.c_str());
}

void run_validate(const ValidateArgs& args) {
  std::vector<std::string> problems;
  Topology target = this_machine();
  try {
    if (!args.topology.empty()) target = parse_topology(args.topology);
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  try {
    LoadedConfig loaded = load_config(args.config_path, args.overrides);
    if (!problems.empty()) return report_problems(args.config_path, problems);
    // Validation plans for training: the transpose rule applies (a superset
    // of what a forward-only run needs).
    TargetCheck chk = check_target(loaded.config, target, /*training=*/true);
    if (!chk.problems.empty()) return report_problems(args.config_path, chk.problems);
    print_valid(args, loaded, chk);
  } catch (const ConfigError& e) {
    problems.insert(problems.end(), e.problems().begin(), e.problems().end());
    report_problems(args.config_path, problems);
  }
}

}  // namespace

void add_validate(CLI::App& app) {
  auto args = std::make_shared<ValidateArgs>();
  CLI::App* cmd = app.add_subcommand("validate", "Resolve and check a config; print the resolved table");
  cmd->add_option("CONFIG", args->config_path, "YAML file: a mapping of `key: value` lines")->required();
  cmd->add_option("OVERRIDES", args->overrides,
                  "key=value overrides, applied after the file (value read as a YAML scalar; `key=` sets "
                  "a string key to empty)");
  cmd->add_option("--topology", args->topology,
                  "Validate for a described target instead of this machine: "
                  "ranks=N,cores=C,mpi_thread=single|funneled|serialized|multiple[,backend=NAME] "
                  "(backends: mpi-multiple, mpi-serialized, mpi-funneled, mpi-single, single-process)");
  cmd->footer(
      "Exit status: 0 when valid (the resolved table, the target and the offload plan are printed "
      "to stdout), 1 when not (every problem is printed to stderr, one per line).\n\n" +
      format_config_help() + "\nSee docs/config.md for the rules of each key.");
  cmd->callback([args] { run_validate(*args); });
}

}  // namespace moe::cli
