// The message of the moe::Error a callable throws, for tests that check what an error names.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "moe/error.h"

namespace moe::testing {

// The message of the moe::Error that f throws ("" and a test failure if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a moe::Error";
  return "";
}

}  // namespace moe::testing
