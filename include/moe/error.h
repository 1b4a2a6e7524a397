// Two kinds of failure (STYLE.md rule 6):
//  - moe::Error: expected failures (user input, files, config). The message
//    names the thing (key, file, tensor) and what was expected; the CLI prints
//    it to stderr and exits non-zero.
//  - MOE_ASSERT: broken invariants. Prints file:line and aborts (under MPI the
//    abort takes every rank down).
#pragma once

#include <new>
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

// The exception boundary around one file, key or rank the library touches:
// runs body(); an exception other than moe::Error (nlohmann-json, yaml-cpp,
// std::filesystem, an allocation) leaves as moe::Error "<context>: <what>",
// so the library throws only moe::Error and every message names its thing.
template <class F>
decltype(auto) with_context(const std::string& context, F&& body) {
  try {
    return body();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(context, ": out of memory");
  } catch (const std::exception& e) {
    fail(context, ": ", e.what());
  }
}

// The message of the exception being handled (call only inside a catch
// block): what() of a std::exception, a fixed text for anything else.
std::string current_exception_text();

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace moe

#define MOE_ASSERT(cond, msg)                                                    \
  do {                                                                           \
    if (!(cond)) ::moe::assert_fail(#cond, __FILE__, __LINE__, (msg));           \
  } while (0)
