#include "commands.h"

namespace moe::cli {
namespace {
int g_exit_code = 0;
}
int exit_code() { return g_exit_code; }
void set_exit_code(int code) { g_exit_code = code; }
}  // namespace moe::cli
