#!/bin/sh
# The collective watchdog under mpirun -np 2 (docs/reliability.md). Usage: watchdog_np2.sh MPIEXEC BIN MODE
#   stop: rank 1 stops itself (SIGSTOP) while rank 0 enters an all-reduce, MOE_COLLECTIVE_TIMEOUT_S=3
#         and the early liveness probe off (MOE_COLLECTIVE_LIVENESS_S=0): the job ends non-zero (not
#         the 60 s timeout) with rank 0's watchdog line naming the op and, from the probe made at the
#         timeout (answers awaited 2 s), rank 1; within 10 s of the stop, and no rank's process is
#         left (the stopped one included).
#   kill: rank 1 is killed (SIGKILL) mid-collective, watchdog at its default: mpirun ends the job, no
#         process left.
# Prints the seconds from rank 1's signal to mpirun's return and to every process gone.
set -u
mpiexec=$1 bin=$2 mode=$3
fail() { echo "watchdog_np2 $mode: $*"; exit 1; }
case $mode in
stop) out=$(MOE_COLLECTIVE_TIMEOUT_S=3 MOE_COLLECTIVE_LIVENESS_S=0 timeout 60 "$mpiexec" --oversubscribe -np 2 "$bin" --stop-before-collective 2>&1) ;;
kill) out=$(timeout 60 "$mpiexec" --oversubscribe -np 2 "$bin" --kill-mid-collective 2>&1) ;;
*) fail "unknown mode" ;;
esac
rc=$?
returned=$(date +%s.%N)
echo "$out"
echo "exit status $rc"
[ $rc -ne 0 ] || fail "the job ended with status 0"
[ $rc -ne 124 ] || fail "the job hung (timeout)"
# A rank's process may still be exiting when mpirun returns: wait up to 10 s (a zombie counts as gone).
alive() { [ -e /proc/$1 ] && ! grep -q '^[0-9]* ([^)]*) Z' /proc/$1/stat 2>/dev/null; }
for pid in $(echo "$out" | sed -n 's/^\[rank [0-9]*\] pid \([0-9]*\)$/\1/p'); do
  for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
  ! alive "$pid" || { kill -9 "$pid"; fail "process $pid is still there 10 s after mpirun returned"; }
done
end=$(date +%s.%N)
signal_at=$(echo "$out" | sed -n 's/^\[rank 1\] raising SIG[A-Z]* at \([0-9.]*\)$/\1/p')
[ -n "$signal_at" ] || fail "rank 1 did not reach its signal"
took=$(awk "BEGIN { printf \"%.1f\", $end - $signal_at }")
mpirun_took=$(awk "BEGIN { printf \"%.1f\", $returned - $signal_at }")
if [ $mode = stop ]; then
  echo "$out" | grep -q 'moe: fatal on rank 0: all_reduce_sum (4 B per rank) did not complete within 3 s (collective_timeout_s); rank 1 did not answer a liveness probe within 2 s (stopped, or dead)' ||
    fail "no watchdog line from rank 0 naming all_reduce_sum and rank 1"
  ! echo "$out" | grep -q 'moe: fatal on rank 1' || fail "the stopped rank blamed its peer"
  awk "BEGIN { exit !($took < 10) }" || fail "took $took s from the stop (more than 10 s)"
fi
echo "watchdog_np2 $mode: mpirun returned $mpirun_took s and every process was gone $took s after rank 1's signal"
