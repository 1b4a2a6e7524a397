// Subcommand registry of the moe CLI. Each cmd_*.cpp defines one add_*()
// that adds its subcommand (options, help, callback) to the app.
#pragma once

#include <CLI/CLI.hpp>

namespace moe::cli {

void add_bench(CLI::App& app);
void add_check(CLI::App& app);
void add_convert(CLI::App& app);
void add_info(CLI::App& app);
void add_init(CLI::App& app);
void add_step(CLI::App& app);
void add_validate(CLI::App& app);
void add_train(CLI::App& app);
void add_report(CLI::App& app);
void add_plan(CLI::App& app);

inline void register_all(CLI::App& app) {
  add_bench(app);
  add_check(app);
  add_convert(app);
  add_info(app);
  add_init(app);
  add_step(app);
  add_validate(app);
  add_train(app);
  add_report(app);
  add_plan(app);
}

// Exit status set by a command that finished without throwing but must still
// report failure (e.g. validate found problems, check missed a bound).
int exit_code();
void set_exit_code(int code);

}  // namespace moe::cli
