// moe: the command-line front end. One file per subcommand (cmd_*.cpp); each
// registers itself through commands.h. Expected errors (moe::Error) print to
// stderr and exit 1; nothing escapes as an uncaught exception.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "moe/error.h"
#include "moe/isa.h"

int main(int argc, char** argv) {
  CLI::App app{"moe: the routed Mixture-of-Experts layer engine (train, run, check, bench)", "moe"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moe " MOE_VERSION);
  moe::cli::register_all(app);
  try {
    moe::active_isa();  // an invalid MOE_GEMM_ISA is an error before any work (include/moe/isa.h)
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "moe: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: error: %s\n", e.what());
    return 1;
  }
  return moe::cli::exit_code();
}
