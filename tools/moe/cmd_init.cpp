#include "commands.h"

namespace moe::cli {
void add_init(CLI::App& app) { app.add_subcommand("init", "(not yet available)"); }
}  // namespace moe::cli
