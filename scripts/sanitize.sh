#!/usr/bin/env bash
# Builds the test suite's binaries (moe, moe_tests, moe_mpi_tests) with AddressSanitizer +
# UndefinedBehaviorSanitizer into ./build-asan (clang, -O1, MOE_SANITIZE=ON, MOE_FUZZ=ON) and runs
# the suite's CTest entries there: unit, layer, CLI and MPI tests (mpirun passes the environment
# below to its ranks), and the fuzz targets' corpus replay. Leak checking is on; tests/sanitize/lsan.supp suppresses only the MPI stack's own
# allocations (docs/reliability.md "Sanitizers"). The first report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs="${MOE_JOBS:-2}"
CC="${MOE_SANITIZE_CC:-clang}" CXX="${MOE_SANITIZE_CXX:-clang++}" \
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_SANITIZE=ON -DMOE_FUZZ=ON >/dev/null
# Only what the suite runs (no gemm_bench), and the fuzz targets: MOE_FUZZ=ON adds the fuzzer's
# coverage hooks to the engine's objects the targets fuzz (not the x86 kernels, the tests or the
# CLI), so the entry `fuzz_replay` (scripts/fuzz.sh --replay) needs no build of its own.
cmake --build build-asan --target moe moe_tests moe_mpi_tests moe_fuzz_targets -j "$jobs"
# abort_on_error: a report ends the process with SIGABRT, whatever exit status a test expects.
# print_suppressions=0: the suppressed MPI leaks are not listed after every rank.
# fast_unwind_on_malloc=0: Open MPI's plugins have no frame pointers and are unloaded by
# MPI_Finalize, so only the slow unwinder reaches the MPI_Init / progress-thread frames that
# lsan.supp names.
export ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:strict_string_checks=1:print_suppressions=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# MOE_SANITIZE=ON leaves out the ThreadSanitizer entry and this one (CMakeLists.txt). -LE heavy:
# the entries labelled `heavy` (the crash loop, the distributed benchmark, the calibration) repeat
# code paths the other entries run once; under ASan they took a third of this run's time.
ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE heavy "$@"
