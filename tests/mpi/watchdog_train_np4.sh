#!/bin/sh
# Measures the collective watchdog on a real job (docs/reliability.md's table; not a CTest entry):
# `moe train` under mpirun -np 4, one rank signalled from outside after WARMUP seconds, then the
# seconds from the signal to mpirun's return and to every rank's process gone, and the watchdog's
# lines. Usage: watchdog_train_np4.sh MPIEXEC MOE SIGNAL [WARMUP] [key=value ...]
#   SIGNAL: STOP or KILL (sent to the last rank's process). Environment (MOE_COLLECTIVE_*) passes on.
set -u
mpiexec=$1 moe=$2 sig=$3 warmup=${4:-4}
shift 3
[ $# -gt 0 ] && shift
log=$(mktemp)
"$mpiexec" --oversubscribe -np 4 "$moe" train steps=1000000 checkpoint_period=0 "$@" >"$log" 2>&1 &
mpirun_pid=$!
sleep "$warmup"
pids=$(pgrep -P $mpirun_pid | sort -n)
[ "$(echo "$pids" | wc -w)" -eq 4 ] || { echo "expected 4 ranks, got: $pids"; kill $mpirun_pid; cat "$log"; exit 1; }
# OpenMPI starts the ranks in rank order: the highest pid is the last rank (checked below by its line).
victim=$(echo "$pids" | tail -n 1)
t0=$(date +%s.%N)
kill -$sig "$victim"
wait $mpirun_pid
rc=$?
t1=$(date +%s.%N)
alive() { [ -e /proc/$1 ] && ! grep -q '^[0-9]* ([^)]*) Z' /proc/$1/stat 2>/dev/null; }
for pid in $pids; do
  for _ in $(seq 300); do alive "$pid" || break; sleep 0.1; done
done
t2=$(date +%s.%N)
grep -E 'moe: fatal|mpirun noticed|exited on signal' "$log"
rm -f "$log"
echo "signal $sig to pid $victim: exit status $rc, mpirun returned after $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") s, every process gone after $(awk "BEGIN { printf \"%.2f\", $t2 - $t0 }") s"
