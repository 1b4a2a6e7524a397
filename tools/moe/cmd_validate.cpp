#include "commands.h"

namespace moe::cli {
void add_validate(CLI::App& app) { app.add_subcommand("validate", "(not yet available)"); }
}  // namespace moe::cli
