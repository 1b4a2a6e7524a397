// `moe validate CONFIG [key=value ...]`: resolve a config exactly as a run
// would and check it. Valid: prints the resolved table to stdout, exits 0.
// Invalid: prints every problem to stderr ("moe: error: ..."), exits 1.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "moe/config.h"

namespace moe::cli {
namespace {

struct ValidateArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  // --topology (SPEC.md §1, "AOT compile for a topology") arrives later: it
  // describes the target machine (ranks, side engine, capability table) and
  // checks the config against that instead of this machine, with the same
  // code as a real run (config_problems plus the backend's checks).
};

void run_validate(const ValidateArgs& args) {
  try {
    LoadedConfig loaded = load_config(args.config_path, args.overrides);
    std::fputs(format_config_table(loaded.table).c_str(), stdout);
    std::printf("config %s is valid\n", args.config_path.c_str());
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems()) std::fprintf(stderr, "moe: error: %s\n", p.c_str());
    std::fprintf(stderr, "moe: config %s is invalid (%zu problem%s)\n", args.config_path.c_str(),
                 e.problems().size(), e.problems().size() == 1 ? "" : "s");
    set_exit_code(1);
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
  // --topology: see ValidateArgs; add the option here when it lands.
  cmd->footer(
      "Exit status: 0 when valid (the resolved table is printed to stdout), 1 when not (every "
      "problem is printed to stderr, one per line).\n\n" +
      format_config_help() + "\nSee docs/config.md for the rules of each key.");
  cmd->callback([args] { run_validate(*args); });
}

}  // namespace moe::cli
