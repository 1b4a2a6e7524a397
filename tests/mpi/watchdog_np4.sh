#!/bin/sh
# Issue 11's target under mpirun -np 4 (docs/reliability.md, "The collective watchdog"): any single
# rank stopped, killed or throwing ends the job, every process gone within 30 s of the signal, exit
# status non-zero, with a message that names the failing rank; a rank that is slow but alive is not
# ended. Usage: watchdog_np4.sh MPIEXEC BIN MODE
#   stop:       rank 3 stops itself (SIGSTOP) while 0-2 wait in an all-reduce; the watchdog at its
#               defaults (liveness probe 10 s, answers awaited 5 s, timeout 300 s): a waiting rank's
#               line names rank 3 as not answering.
#   stop_short: the same with MOE_COLLECTIVE_LIVENESS_S=2 (a few seconds).
#   kill:       rank 3 killed (SIGKILL): mpirun names it ("process rank 3 ... exited on signal 9").
#   throw:      rank 3 throws a std::out_of_range inside run_collectively: "fatal on rank 3: ...".
#   slow:       rank 3 computes for 6 s (outside MPI) while the others wait, MOE_COLLECTIVE_LIVENESS_S=1
#               (probed ~5 times, answers every time): the all-reduce completes, exit status 0.
#   stuck:      rank 3 computes for 60 s, MOE_COLLECTIVE_LIVENESS_S=1, MOE_COLLECTIVE_TIMEOUT_S=4: alive,
#               so the timeout ends the job, naming rank 3 as not having issued the collective and
#               what it was doing.
# Prints the seconds from rank 3's signal (or throw, or start of computing) to mpirun's return and to
# every process gone.
set -u
mpiexec=$1 bin=$2 mode=$3
fail() { echo "watchdog_np4 $mode: $*"; exit 1; }
run() { timeout 90 "$mpiexec" --oversubscribe -np 4 "$bin" "$@" 2>&1; }
# The defaults, whatever the caller's environment says.
unset MOE_COLLECTIVE_TIMEOUT_S MOE_COLLECTIVE_LIVENESS_S
case $mode in
stop) out=$(run --stop-before-collective) ;;
stop_short) out=$(MOE_COLLECTIVE_LIVENESS_S=2 run --stop-before-collective) ;;
kill) out=$(run --kill-mid-collective) ;;
throw) out=$(run --throw-mid-collective-last) ;;
slow) out=$(MOE_COLLECTIVE_LIVENESS_S=1 run --slow-peer 6) ;;
stuck) out=$(MOE_COLLECTIVE_LIVENESS_S=1 MOE_COLLECTIVE_TIMEOUT_S=4 run --slow-peer 60) ;;
*) fail "unknown mode" ;;
esac
rc=$?
returned=$(date +%s.%N)
echo "$out"
echo "exit status $rc"
[ $rc -ne 124 ] || fail "the job hung (timeout)"
if [ $mode = slow ]; then
  [ $rc -eq 0 ] || fail "a slow but alive rank ended the job (status $rc)"
  [ "$(echo "$out" | grep -c 'all_reduce completed after the slow peer')" -eq 4 ] || fail "not every rank completed"
  ! echo "$out" | grep -q 'moe: fatal' || fail "a watchdog line for a slow but alive rank"
  echo "watchdog_np4 slow: every rank completed"
  exit 0
fi
[ $rc -ne 0 ] || fail "the job ended with status 0"
# A rank's process may still be exiting when mpirun returns: wait up to 10 s (a zombie counts as gone).
alive() { [ -e /proc/$1 ] && ! grep -q '^[0-9]* ([^)]*) Z' /proc/$1/stat 2>/dev/null; }
pids=$(echo "$out" | sed -n 's/^\[rank [0-9]*\] pid \([0-9]*\)$/\1/p')
[ "$(echo "$pids" | wc -w)" -eq 4 ] || fail "expected 4 pids, got: $pids"
for pid in $pids; do
  for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
  ! alive "$pid" || { kill -9 "$pid"; fail "process $pid is still there 10 s after mpirun returned"; }
done
end=$(date +%s.%N)
signal_at=$(echo "$out" | sed -n 's/^\[rank 3\] \(raising [^ ]* at\|computing for [0-9.]* s from\) \([0-9.]*\)$/\2/p')
[ -n "$signal_at" ] || fail "rank 3 did not reach its signal"
took=$(awk "BEGIN { printf \"%.1f\", $end - $signal_at }")
mpirun_took=$(awk "BEGIN { printf \"%.1f\", $returned - $signal_at }")
case $mode in
stop | stop_short)
  echo "$out" | grep -Eq 'moe: fatal on rank [0-2]: all_reduce_sum \(4 B per rank\) has waited [0-9.]+ s \(collective_liveness_s [0-9.]+\); rank 3 did not answer a liveness probe within [0-9.]+ s \(stopped, or dead\)' ||
    fail "no watchdog line naming rank 3 as not answering"
  ! echo "$out" | grep -q 'moe: fatal on rank 3' || fail "the stopped rank blamed its peers" ;;
kill)
  echo "$out" | grep -Eq 'process rank 3 with PID [0-9]+ .*exited on signal 9' || fail "mpirun did not name rank 3" ;;
throw)
  echo "$out" | grep -q 'moe: fatal on rank 3: deliberate std::out_of_range' || fail "no line naming rank 3" ;;
stuck)
  echo "$out" | grep -Eq 'moe: fatal on rank [0-2]: all_reduce_sum \(4 B per rank\) did not complete within 4 s \(collective_timeout_s\); rank 3 had not issued it \([0-9]+ of [0-9]+ collectives on its communicator\): in no collective or side-engine wait for [0-9.]+ s' ||
    fail "no watchdog line naming rank 3 as not having issued the all-reduce" ;;
esac
awk "BEGIN { exit !($took < 30) }" || fail "took $took s from rank 3's signal (30 s or more)"
echo "watchdog_np4 $mode: mpirun returned $mpirun_took s and every process was gone $took s after rank 3's signal"
