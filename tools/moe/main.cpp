// moe: the command-line front end. One file per subcommand (cmd_*.cpp); each
// registers itself through commands.h. The exception boundary of every
// command: any exception prints "moe: error: <message>" to stderr and exits 1;
// under mpirun (a world of several ranks was made) it aborts the whole job
// instead, so no peer is left waiting in a collective (docs/reliability.md).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "moe/error.h"
#include "moe/isa.h"

namespace {
int fail_command(const std::string& msg) {
  moe::Communicator* w = moe::cli::world_if_made();
  if (w && w->size() > 1) {
    std::fflush(stdout);
    w->abort(msg);
  }
  std::fprintf(stderr, "moe: error: %s\n", msg.c_str());
  return 1;
}
}  // namespace

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
  } catch (...) {
    return fail_command(moe::current_exception_text());
  }
  return moe::cli::exit_code();
}
