#!/bin/sh
# moe step --trace under mpirun -np 2 with every offload target live: the
# Chrome trace JSON holds both ranks and a side-engine track (tid 1) with the
# offloaded all-to-alls. Usage: step_trace_np2.sh MPIEXEC MOE SOURCE_DIR WORK_DIR
set -eu
mpiexec=$1 moe=$2 src=$3 work=$4
mkdir -p "$work"
"$moe" init --config "$src/examples/small.yaml" --out "$work/w.st" --inputs "$work/in.st" --tokens 32 emb_dim=64
"$mpiexec" --oversubscribe -np 2 "$moe" step --config "$src/examples/small.yaml" --weights "$work/w.st" \
  --inputs "$work/in.st" --out "$work/out.st" --trace "$work/trace.json" \
  emb_dim=64 expert_parallelism=2 moe_offload_targets=all num_moe_token_chunks=2
t="$work/trace.json"
fail() { echo "step_trace_np2: $*"; exit 1; }
grep -q '"traceEvents"' "$t" || fail "no traceEvents"
grep -q '"name": "side"' "$t" || fail "no side-engine track (thread_name side)"
grep -q '"tid": 1' "$t" || fail "no op on tid 1 (the side track)"
grep -q '"name": "A2A:dispatch\[0\]"' "$t" || fail "no A2A:dispatch[0] op"
grep -q '"name": "rank 1"' "$t" || fail "rank 1's ops missing"
grep -q '"pid": 1' "$t" || fail "no op of rank 1"
# Per-op bytes: an op's collectives' payload (this rank's, as the counters count it); 0 for compute.
flat=$(tr -d '\n ' < "$t")
bytes_of() { echo "$flat" | grep -o "\"args\":{\"bytes\":[0-9]*}[^}]*\"name\":\"$1\"" | head -1 | sed 's/.*"bytes":\([0-9]*\).*/\1/'; }
b=$(bytes_of 'A2A:dispatch\[0\]'); [ -n "$b" ] && [ "$b" -gt 0 ] || fail "A2A:dispatch[0] bytes: '$b' (expected > 0)"
b=$(bytes_of 'AG:aux_stats'); [ -n "$b" ] && [ "$b" -gt 0 ] || fail "AG:aux_stats bytes: '$b' (expected > 0)"
b=$(bytes_of 'ffn\[0\]'); [ "$b" = 0 ] || fail "ffn[0] bytes: '$b' (expected 0)"
echo "step_trace_np2: OK ($(grep -c '"ph": "X"' "$t") ops)"
