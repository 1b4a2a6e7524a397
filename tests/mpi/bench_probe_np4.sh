#!/bin/sh
# The pairs pattern of `moe bench --dist`'s link probe (scripts/plan_cluster.sh measures the 4-host
# links with it): every pair of ranks all-gathering at once, both passes timed; an odd number of
# ranks has no pairs and must say so.
# Usage: bench_probe_np4.sh MPIEXEC MOE
set -eu
MPIEXEC=$1 MOE=$2
num='[0-9][0-9.]*'
out=$("$MPIEXEC" --oversubscribe -np 4 "$MOE" bench --dist --probe-mb 0.5 --probe-pattern pairs --probe-calls 2 --iters 2)
echo "$out"
echo "$out" | grep -Eq "probe: 2 all-gather\(s\) in pairs of ranks, 4 ranks, 0.50 MB out of each rank: median $num ms = $num Mbit/s per rank; polite waits: median $num ms" ||
  { echo "pairs: unexpected output"; exit 1; }
if out=$("$MPIEXEC" --oversubscribe -np 3 "$MOE" bench --dist --probe-mb 0.5 --probe-pattern pairs --iters 2 2>&1); then
  echo "$out"; echo "3 ranks in pairs: expected an error"; exit 1
fi
echo "$out" | grep -q "probe-pattern pairs: needs an even number of ranks (got 3)" ||
  { echo "$out"; echo "3 ranks in pairs: the error does not say why"; exit 1; }
echo "bench_probe_np4: OK"
