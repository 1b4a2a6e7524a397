#!/usr/bin/env bash
# The libFuzzer targets (fuzz/, docs/reliability.md "Fuzzing"): builds them with clang into
# ./build-fuzz (MOE_FUZZ=ON: ASan + UBSan + the fuzzer's coverage on every engine object) and runs
# each with its seed corpus (fuzz/<target>/corpus/) and dictionary (fuzz/<target>.dict), leak
# checking on. New inputs go to build-fuzz/corpus/<target>/, never into the committed corpus.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]    fuzz each target SECONDS (default 60)
#   scripts/fuzz.sh --runs N [TARGET...]     fuzz each target for N executions
#   scripts/fuzz.sh --replay [SECONDS]       run every committed corpus file (seeds and inputs
#                                            that once crashed) through its target, then fuzz
#                                            each target SECONDS (default 10): the CTest entry
#
# MOE_JOBS targets run at a time (default 2).
#
# MOE_FUZZ_DIR=DIR uses another build directory configured with MOE_FUZZ=ON (scripts/sanitize.sh's
# build-asan, where the targets share the sanitized suite's objects) instead of build-fuzz.
#
# Prints the executions reached per target; exits non-zero on any crash, leak, sanitizer report,
# timeout or out-of-memory (the input is kept in build-fuzz/artifacts/).
set -euo pipefail
cd "$(dirname "$0")/.."
ALL_TARGETS=(safetensors checkpoint config metrics topology offload)

mode=time seconds=60 runs=0
case "${1:-}" in
  --replay) mode=replay seconds="${2:-10}"; shift $(( $# > 1 ? 2 : 1 )) ;;
  --runs) mode=runs runs="${2:?--runs needs a count}"; shift 2 ;;
  '' ) ;;
  *) if [[ "$1" =~ ^[0-9]+$ ]]; then seconds="$1"; shift; fi ;;
esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

B="${MOE_FUZZ_DIR:-build-fuzz}"
# Configured once (the build re-runs CMake when a CMakeLists.txt changes).
if [ ! -f "$B/build.ninja" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ -DMOE_FUZZ=ON \
    -DMOE_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$B" --target "${targets[@]/%/_fuzz}" -j "${MOE_JOBS:-2}"

# quarantine_size_mb: freed memory stays poisoned for the next 16 MB of frees (each input is small;
# the default 256 MB makes every execution fault in fresh pages: 1.7x fewer executions per second).
# fast_unwind_on_malloc=1 after the inherited options: scripts/sanitize.sh sets the slow unwinder
# for Open MPI's plugins, which no target loads, and with it the targets ran 5-7x fewer executions.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:quarantine_size_mb=16:${ASAN_OPTIONS:-}:fast_unwind_on_malloc=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
# -timeout: an input running 10 s is a hang; -rss_limit_mb: no reader may need 2 GB for a small input.
common=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
for t in "${targets[@]}"; do
  [ -x "$B/fuzz/${t}_fuzz" ] || { echo "fuzz: no target '$t' (targets: ${ALL_TARGETS[*]})"; exit 2; }
done
mkdir -p "$B/artifacts"

# fuzz_one TARGET: the replay (in --replay mode), then the fuzzing; prints its report, returns 1 on
# any failure.
fuzz_one() {
  local t=$1 failed=0 bin=$B/fuzz/${1}_fuzz seeds=fuzz/$1/corpus work=$B/corpus/$1 log=$B/fuzz-$1.log
  mkdir -p "$work"
  local args=("${common[@]}" -dict=fuzz/$t.dict "-artifact_prefix=$B/artifacts/$t-")
  if [ "$mode" = replay ]; then
    # Each committed input once (-runs=0 executes the corpus and stops).
    if ! "$bin" "${args[@]}" -runs=0 "$seeds" >"$log.replay" 2>&1; then
      echo "fuzz: $t: a committed corpus input fails (log: $log.replay)"; tail -30 "$log.replay"; return 1
    fi
    echo "fuzz: $t: replayed $(ls "$seeds" | wc -l) corpus files"
  fi
  local limit=(-max_total_time="$seconds")
  [ "$mode" = runs ] && limit=(-runs="$runs")
  local start rc=0 status
  start=$(date +%s.%N)
  "$bin" "${args[@]}" "${limit[@]}" "$work" "$seeds" >"$log" 2>&1 || rc=$?
  # 72: libFuzzer's exit status when interrupted (SIGINT): stopped, nothing found.
  case $rc in 0) status=ok ;; 72) status=interrupted failed=1 ;; *) status=FAILED failed=1 ;; esac
  local secs execs rate corpus
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(awk -v n="${execs:-0}" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
  corpus=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)  # inputs kept, as libFuzzer counts
  printf 'fuzz: %-12s %s: %s executions in %s s (%s exec/s), corpus %s inputs, log %s\n' "$t" "$status" \
    "${execs:-?}" "$secs" "$rate" "${corpus:-?}" "$log"
  if [ $status = FAILED ]; then
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written|uncaught exception' "$log" | head -20 || true
    echo "fuzz: $t: keep the input as fuzz/$t/corpus/crash-<name> and add a regression test (tests/unit/)"
  fi
  return $failed
}

# MOE_JOBS targets at a time (default 2), each report printed whole, in the targets' order.
jobs="${MOE_JOBS:-2}"
failed=0 running=0
for t in "${targets[@]}"; do
  if [ $running -ge "$jobs" ]; then wait -n || failed=1; running=$((running - 1)); fi
  fuzz_one "$t" >"$B/fuzz-$t.report" 2>&1 &
  running=$((running + 1))
done
while [ $running -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done
for t in "${targets[@]}"; do cat "$B/fuzz-$t.report"; done
exit $failed
