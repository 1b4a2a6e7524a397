#!/usr/bin/env bash
# Builds the concurrent classes (side engine, thread pool, step trace, tensor allocator) and
# their tests with ThreadSanitizer into ./build-tsan, and runs them.
# Only the small moe_tsan_tests binary is built (see CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_TSAN=ON >/dev/null
cmake --build build-tsan --target moe_tsan_tests -j "${MOE_JOBS:-2}"
# halt_on_error: the first race fails the run; second_deadlock_stack helps lock-order reports.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
  ./build-tsan/moe_tsan_tests --gtest_filter='SideEngine*:ThreadPool*:StepTrace*:Allocator*' --gtest_repeat="${MOE_TSAN_REPEAT:-3}"
