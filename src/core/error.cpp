#include "moe/error.h"

#include <cstdio>
#include <cstdlib>

namespace moe {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "moe: internal error at %s:%d: %s (%s)\n", file, line, msg.c_str(), expr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace moe
