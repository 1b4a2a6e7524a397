// moe: the command-line front end. One file per subcommand (cmd_*.cpp); each
// registers itself through commands.h. The exception boundary of every
// command: any exception prints "moe: error: <message>" to stderr and exits 1.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "moe/error.h"

int main(int argc, char** argv) {
  CLI::App app{"moe: the routed Mixture-of-Experts layer engine (train, run, check, bench)", "moe"};
  app.require_subcommand(1);
  moe::cli::register_all(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (...) {
    std::fprintf(stderr, "moe: error: %s\n", moe::current_exception_text().c_str());
    return 1;
  }
  return moe::cli::exit_code();
}
