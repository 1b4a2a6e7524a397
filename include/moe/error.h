// Two kinds of failure (STYLE.md rule 6):
//  - moe::Error: expected failures (user input, files, config). The message
//    names the thing (key, file, tensor) and what was expected; the CLI prints
//    it to stderr and exits non-zero.
//  - MOE_ASSERT: broken invariants. Prints file:line and aborts (under MPI the
//    abort takes every rank down).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds a message from streamable pieces: fail("[op] bad shape ", shape).
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace moe

#define MOE_ASSERT(cond, msg)                                                    \
  do {                                                                           \
    if (!(cond)) ::moe::assert_fail(#cond, __FILE__, __LINE__, (msg));           \
  } while (0)
