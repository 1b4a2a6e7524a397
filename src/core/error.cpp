#include "moe/error.h"

#include <cstdio>
#include <cstdlib>

namespace moe {

std::string current_exception_text() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc)";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "moe: internal error at %s:%d: %s (%s)\n", file, line, msg.c_str(), expr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace moe
