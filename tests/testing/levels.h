// Kernel levels as a test parameter: a test runs once per level
// (include/moe/isa.h), at that level; a level this CPU lacks is skipped with
// the reason printed.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "moe/isa.h"

namespace moe::testing {

// Every level, and the fast ones (all but the reference twin itself).
inline std::vector<Isa> all_levels() { return isa_all(); }
inline std::vector<Isa> fast_levels() {
  return {Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx_bf16, Isa::neon, Isa::neon_bf16};
}

inline Isa level_of(Isa isa) { return isa; }
template <class... Ts>
Isa level_of(const std::tuple<Ts...>& t) {
  return std::get<Isa>(t);
}

// Fixture: the parameter (an Isa, or a tuple holding one) names the level.
template <class P>
class LevelTest : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override {
    const Isa isa = level_of(this->GetParam());
    if (!isa_supported(isa))
      GTEST_SKIP() << "kernel level " << isa_name(isa) << " is not available on this CPU (or build); it runs "
                   << isa_list(isa_available());
    scoped_.emplace(isa);
  }
  void TearDown() override { scoped_.reset(); }

 private:
  std::optional<ScopedIsa> scoped_;
};

inline std::string level_param_name(const ::testing::TestParamInfo<Isa>& info) { return isa_name(info.param); }

}  // namespace moe::testing

namespace moe {
// Test names and messages show a level by name.
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace moe
