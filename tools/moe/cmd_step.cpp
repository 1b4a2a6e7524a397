#include "commands.h"

namespace moe::cli {
void add_step(CLI::App& app) { app.add_subcommand("step", "(not yet available)"); }
}  // namespace moe::cli
